//! Label selectors as the API server reads them (an operation's `machineSelector`, a
//! PodDisruptionBudget's `selector`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// `metav1.LabelSelector` semantics: every `matchLabels` pair and every expression must hold;
/// an empty selector matches everything.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator the API server would have rejected matches nothing.
            _ => false,
        }
    });
    pairs && exprs
}
