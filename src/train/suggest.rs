//! "Did you mean": the names closest to a tensor name that did not resolve, so that a typo in
//! a predictor's outputs or a callback's fetches is answered with the right spelling instead
//! of a bare "not found".

use crate::dsl::TowerHandle;
use crate::ir::Graph;

/// How many suggestions a message shows at most.
const MAX_SUGGESTIONS: usize = 3;

/// The names among `candidates` within a small edit distance of `wanted` (at most a third of
/// its length, at least 2), closest first, at most [`MAX_SUGGESTIONS`].
pub(crate) fn closest_names<'a>(
    wanted: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let limit = (wanted.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .filter(|c| *c != wanted)
        .map(|c| (strsim::levenshtein(wanted, c), c))
        .filter(|&(d, _)| d <= limit)
        .collect();
    scored.sort_unstable();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// The names a tower's tensors can be asked for by (relative to its name scope), and its
/// signature input names.
pub(crate) fn tower_tensor_names(graph: &Graph, tower: &TowerHandle) -> Vec<String> {
    let prefix = if tower.ns_name.is_empty() {
        String::new()
    } else {
        format!("{}/", tower.ns_name)
    };
    let mut names: Vec<String> = graph
        .node_ids()
        .filter_map(|id| {
            graph
                .node(id)
                .name
                .strip_prefix(prefix.as_str())
                .map(str::to_string)
        })
        .collect();
    names.extend(tower.inputs.iter().map(|(name, _)| name.clone()));
    names
}

/// `"; did you mean `a` or `b`?"`, or nothing without suggestions.
pub(crate) fn did_you_mean(suggestions: &[String]) -> String {
    match suggestions {
        [] => String::new(),
        [one] => format!("; did you mean `{one}`?"),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(|s| format!("`{s}`")).collect();
            format!("; did you mean {} or `{last}`?", rest.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_suggests_the_closest_names_first() {
        let names = [
            "linear/output",
            "linear/W",
            "fc0/output",
            "cost",
            "linear/outputs",
        ];
        let found = closest_names("linear/ouput", names);
        assert_eq!(found, ["linear/output", "linear/outputs"]);
        assert_eq!(
            did_you_mean(&found),
            "; did you mean `linear/output` or `linear/outputs`?"
        );
    }

    #[test]
    fn an_unrelated_name_suggests_nothing() {
        let found = closest_names("accuracy", ["linear/output", "cost"]);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(did_you_mean(&found), "");
    }
}
