//! `#[tier(controlplane)]` on a test: compiled as ignored, with the reason
//! `SKIPPED controlplane: FLEXNODE_SKIP_CONTROLPLANE=1`, when `build.rs` set the tier's skip cfg
//! (its variable is exactly `1`); the test itself still calls `require` (tests/support/tier.rs).
//! Above a plain `#[test]` (below `#[tokio::test]`, which keeps the attributes after it): under
//! `#[test]` the skip never took effect (the cluster and node crates' sync tests failed with the
//! tier skipped).
//! `#[tier(nspawn, controlplane)]`: a test of two tiers, ignored when either is skipped (with
//! the first one's reason when both are). A tier's variable is `FLEXNODE_SKIP_` and its name in
//! capitals (`host_suite` is the tier `host-suite`, `FLEXNODE_SKIP_HOST_SUITE`); a name
//! `build.rs` does not list is refused by rustc's check of cfg values.
//!
//! Written without syn or quote: the attribute is a list of identifiers, and the item passes
//! through untouched.

use proc_macro::{TokenStream, TokenTree};

#[proc_macro_attribute]
pub fn tier(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut names = Vec::new();
    for (i, token) in attr.into_iter().enumerate() {
        match token {
            TokenTree::Ident(name) if i % 2 == 0 => names.push(name.to_string()),
            TokenTree::Punct(p) if i % 2 == 1 && p.as_char() == ',' => {}
            _ => return refuse(),
        }
    }
    if names.is_empty() {
        return refuse();
    }
    let mut out = TokenStream::new();
    let mut earlier: Vec<String> = Vec::new();
    for name in &names {
        let tier = name.replace('_', "-");
        let variable = format!("FLEXNODE_SKIP_{}", name.to_uppercase());
        let skipped = format!("flexnode_skip = \"{tier}\"");
        // One `ignore` at most: a later tier's only when no earlier one is skipped.
        let when = if earlier.is_empty() {
            skipped.clone()
        } else {
            format!("all({skipped}, not(any({})))", earlier.join(", "))
        };
        let attr: TokenStream =
            format!("#[cfg_attr({when}, ignore = \"SKIPPED {tier}: {variable}=1\")]")
                .parse()
                .expect("a cfg_attr attribute");
        out.extend(attr);
        earlier.push(skipped);
    }
    out.extend(item);
    out
}

fn refuse() -> TokenStream {
    "compile_error!(\"#[tier(...)] wants tier names, e.g. #[tier(controlplane)] or #[tier(nspawn, controlplane)]\");"
        .parse()
        .expect("a compile_error! invocation")
}
