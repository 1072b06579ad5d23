//! The fuzz targets' checks (`fuzz/src/`, one module per target), compiled here with the stable
//! compiler for `fuzz_findings` and `url_secrets`. They name each other as `crate::common`,
//! `crate::archive`, … (in `fuzz/src/lib.rs` they are the crate's root): those names resolve
//! to this module's re-exports at the test crate's root (`main.rs`).

#[path = "../../fuzz/src/archive.rs"]
pub mod archive;
#[path = "../../fuzz/src/archive_url.rs"]
pub mod archive_url;
#[path = "../../fuzz/src/common.rs"]
pub mod common;
#[path = "../../fuzz/src/config.rs"]
pub mod config;
#[path = "../../fuzz/src/layer.rs"]
pub mod layer;
#[path = "../../fuzz/src/manifest.rs"]
pub mod manifest;
#[path = "../../fuzz/src/oci_ref.rs"]
pub mod oci_ref;
#[path = "../../fuzz/src/seeds.rs"]
pub mod seeds;
#[path = "../../fuzz/src/store.rs"]
pub mod store;
#[path = "../../fuzz/src/upgrade_params.rs"]
pub mod upgrade_params;
