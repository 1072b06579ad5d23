//! The generated CRDs against the upstream ones at the version the AKS Flex Node agent pins
//! (`github.com/Azure/unbounded`, `e2e/upstream/go.mod`; fetched from the Go module proxy by
//! `e2e/upstream/fetch`, checked against go.sum). Every upstream field path must exist in
//! ours with the same type and format; ours may not be stricter (no enum where upstream has
//! none, no fewer enum values, no field required that upstream leaves optional, no bound,
//! pattern or validation rule upstream lacks). Fields only
//! ours has are allowed. The names, scope, versions and subresources must match.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn upstream_dir() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/upstream/fetch");
    let out = Command::new(&script)
        .output()
        .expect("run e2e/upstream/fetch");
    assert!(
        out.status.success(),
        "e2e/upstream/fetch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("a CRD")
}

/// Every schema node by path (`.spec.x`, `[]` for items, `{}` for map values).
fn nodes(schema: &Value, path: String, out: &mut BTreeMap<String, Value>) {
    out.insert(path.clone(), schema.clone());
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            nodes(v, format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = schema.get("items") {
        nodes(items, format!("{path}[]"), out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        nodes(values, format!("{path}{{}}"), out);
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    let mut out: Vec<String> = v
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The schema keys that narrow what a field takes.
const VALIDATIONS: [&str; 14] = [
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
];

/// Narrowings ours has on purpose. The Machine's `status.conditions` is a map by `type` (as
/// upstream's MachineOperation has it): one condition per type, and each writer's own under
/// server-side apply. Only agents and controllers write status, never a manifest, and the agent
/// writes it whole with the object's resourceVersion (`src/effects/kube.rs` `write_status`), so
/// it keeps other writers' conditions under upstream's CRD as under ours.
const ACCEPTED: [(&str, &str); 1] = [(".status.conditions", "x-kubernetes-list-type")];

/// Equal, a number by its value (YAML's `0` and schemars' `0.0`).
fn same(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a.and_then(Value::as_f64), b.and_then(Value::as_f64)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// What in `ours` would refuse or mistype a manifest valid for `upstream`.
fn differences(upstream: &Value, ours: &Value) -> Vec<String> {
    let mut diffs = Vec::new();
    for key in ["group", "scope", "names"] {
        let (u, o) = (&upstream["spec"][key], &ours["spec"][key]);
        if key == "names" {
            for field in ["kind", "listKind", "plural", "singular", "shortNames"] {
                if u[field] != o[field] {
                    diffs.push(format!(
                        "spec.names.{field}: upstream {} ours {}",
                        u[field], o[field]
                    ));
                }
            }
        } else if u != o {
            diffs.push(format!("spec.{key}: upstream {u} ours {o}"));
        }
    }
    let versions = upstream["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!versions.is_empty(), "upstream has no versions");
    for uv in versions {
        let name = uv["name"].as_str().unwrap_or_default().to_string();
        let Some(ov) = ours["spec"]["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == uv["name"]))
        else {
            diffs.push(format!("version {name} missing"));
            continue;
        };
        for key in ["served", "storage", "subresources"] {
            if uv[key] != ov[key] {
                diffs.push(format!(
                    "{name} {key}: upstream {} ours {}",
                    uv[key], ov[key]
                ));
            }
        }
        let (mut up, mut mine) = (BTreeMap::new(), BTreeMap::new());
        nodes(&uv["schema"]["openAPIV3Schema"], String::new(), &mut up);
        nodes(&ov["schema"]["openAPIV3Schema"], String::new(), &mut mine);
        assert!(
            up.len() > 10,
            "{name}: upstream schema too small to be real"
        );
        for (path, u) in &up {
            let at = if path.is_empty() { "(root)" } else { path };
            let Some(o) = mine.get(path) else {
                diffs.push(format!(
                    "{name} {at}: missing (upstream type {})",
                    u["type"]
                ));
                continue;
            };
            for key in ["type", "format"] {
                if u.get(key) != o.get(key) {
                    diffs.push(format!(
                        "{name} {at}: {key} upstream {:?} ours {:?}",
                        u.get(key),
                        o.get(key)
                    ));
                }
            }
            let (ue, oe) = (strings(u.get("enum")), strings(o.get("enum")));
            if !oe.is_empty() && (ue.is_empty() || ue.iter().any(|v| !oe.contains(v))) {
                diffs.push(format!("{name} {at}: enum upstream {ue:?} ours {oe:?}"));
            }
            // A bound, a pattern or a rule ours adds or changes could refuse what upstream takes.
            for key in VALIDATIONS {
                if o.get(key).is_some()
                    && !same(u.get(key), o.get(key))
                    && !ACCEPTED.contains(&(path.as_str(), key))
                {
                    diffs.push(format!(
                        "{name} {at}: {key} upstream {:?} ours {:?}",
                        u.get(key),
                        o.get(key)
                    ));
                }
            }
            let (ur, or) = (strings(u.get("required")), strings(o.get("required")));
            let extra: Vec<&String> = or.iter().filter(|r| !ur.contains(r)).collect();
            if !extra.is_empty() {
                diffs.push(format!("{name} {at}: ours also requires {extra:?}"));
            }
        }
    }
    diffs
}

#[test]
fn our_crds_take_every_upstream_field_with_its_type() {
    let dir = upstream_dir().join("deploy/machina/crd");
    let ours: BTreeMap<String, String> = flexnode::api::crds().expect("crds").into_iter().collect();
    for (upstream_file, ours_file) in [
        (
            "unbounded-cloud.io_machines.yaml",
            "machines.unbounded-cloud.io.yaml",
        ),
        (
            "unbounded-cloud.io_machineoperations.yaml",
            "machineoperations.unbounded-cloud.io.yaml",
        ),
    ] {
        let upstream = yaml(
            &std::fs::read_to_string(dir.join(upstream_file))
                .unwrap_or_else(|e| panic!("{upstream_file}: {e}")),
        );
        let mine = yaml(ours.get(ours_file).expect("our CRD"));
        let diffs = differences(&upstream, &mine);
        assert!(
            diffs.is_empty(),
            "{ours_file} differs from upstream {upstream_file}:\n{}",
            diffs.join("\n")
        );
    }
}

#[test]
fn the_comparison_sees_every_difference_that_could_refuse_an_upstream_manifest() {
    let crd = |props: Value, required: Value| {
        serde_json::json!({"spec": {"group": "g", "scope": "Cluster", "names": {"kind": "K"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": props,
                    "required": required}}}]}})
    };
    let many = |extra: Value| {
        let mut p = serde_json::Map::new();
        for i in 0..12 {
            p.insert(format!("f{i}"), serde_json::json!({"type": "string"}));
        }
        if let Value::Object(e) = extra {
            p.extend(e);
        }
        Value::Object(p)
    };
    let upstream = crd(
        many(
            serde_json::json!({"n": {"type": "integer", "format": "int32"}, "s": {"type": "string"}}),
        ),
        serde_json::json!([]),
    );
    assert_eq!(differences(&upstream, &upstream), Vec::<String>::new());
    let wrong = crd(
        many(serde_json::json!({"n": {"type": "string"}, "s": {"type": "string", "enum": ["a"]}})),
        serde_json::json!(["f1"]),
    );
    let d = differences(&upstream, &wrong).join("\n");
    assert!(d.contains(".n: type"), "{d}");
    assert!(d.contains(".n: format"), "{d}");
    assert!(d.contains(".s: enum"), "{d}");
    assert!(d.contains("also requires [\"f1\"]"), "{d}");
    let mut missing = upstream.clone();
    missing["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        .as_object_mut()
        .expect("props")
        .remove("s");
    assert!(
        differences(&upstream, &missing)
            .join("\n")
            .contains(".s: missing")
    );

    // Each narrowing of a field that upstream leaves open is seen, and fewer enum values.
    let open = crd(
        many(serde_json::json!({"e": {"type": "string", "enum": ["a", "b"]}})),
        serde_json::json!([]),
    );
    for (key, value) in [
        ("minimum", serde_json::json!(1)),
        ("maxLength", serde_json::json!(63)),
        ("pattern", serde_json::json!("^[a-z]+$")),
        ("maxItems", serde_json::json!(3)),
        (
            "x-kubernetes-validations",
            serde_json::json!([{"rule": "self != ''"}]),
        ),
    ] {
        let mut narrowed = open.clone();
        narrowed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["f0"][key] =
            value;
        let d = differences(&open, &narrowed).join("\n");
        assert!(d.contains(&format!(".f0: {key}")), "{key}: {d}");
    }
    let mut fewer = open.clone();
    fewer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["e"]["enum"] =
        serde_json::json!(["a"]);
    assert!(
        differences(&open, &fewer).join("\n").contains(".e: enum"),
        "fewer enum values"
    );

    // The names, the scope, the versions and their subresources.
    let changed = |f: &dyn Fn(&mut Value)| {
        let mut c = open.clone();
        f(&mut c);
        differences(&open, &c).join("\n")
    };
    assert!(changed(&|c| c["spec"]["names"]["kind"] = "Other".into()).contains("spec.names.kind"));
    assert!(changed(&|c| c["spec"]["scope"] = "Namespaced".into()).contains("spec.scope"));
    assert!(
        changed(&|c| c["spec"]["versions"][0]["name"] = "v2".into()).contains("version v1 missing")
    );
    assert!(
        changed(&|c| c["spec"]["versions"][0]["subresources"] = serde_json::json!({"status": {}}))
            .contains("v1 subresources")
    );
    assert!(changed(&|c| c["spec"]["versions"][0]["served"] = false.into()).contains("v1 served"));
}
