//! The module graph of a crate, read from its sources: which top-level
//! module refers to which (`crate::x` paths outside comments and tests),
//! and the cycles in it. The operators' tests assert there are none, so
//! that a module never imports one that calls it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules it refers to.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph of the crate whose `src` directory is `src`. `lib.rs` and
/// `main.rs` (the roots) and test-only files (`tests.rs`, `golden.rs`, and
/// everything after a file's first `#[cfg(test)]`) are left out; the crate's
/// error type re-exported at the root (`crate::Error`) counts as `error`.
pub fn graph(src: &Path) -> std::io::Result<Graph> {
    let mut graph = Graph::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let Some(module) = top_module(src, &path) else {
                continue;
            };
            let text = std::fs::read_to_string(&path)?;
            let uses = graph.entry(module.clone()).or_default();
            for used in references(&text) {
                if used != module {
                    uses.insert(used);
                }
            }
        }
    }
    Ok(graph)
}

/// The top-level module a source file belongs to, or None for the roots,
/// test-only files and what is not Rust.
fn top_module(src: &Path, path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if !name.ends_with(".rs") || matches!(name, "tests.rs" | "golden.rs") {
        return None;
    }
    let relative = path.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let module = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(module, "lib" | "main")).then(|| module.to_string())
}

/// The top-level modules `text` refers to through `crate::` paths, in code
/// before its tests, comments left out.
fn references(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a, b::c}`: the first segment of each entry.
                let group = group.split('}').next().unwrap_or_default();
                for entry in group.split(',') {
                    found.extend(first_segment(entry.trim()));
                }
            } else {
                found.extend(first_segment(rest));
            }
        }
    }
    found
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    match name.as_str() {
        "" | "self" => None,
        "Error" => Some("error".into()),
        _ => Some(name),
    }
}

/// The graph's cycles: every strongly connected set of more than one
/// module, each sorted, found with Tarjan's algorithm.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    set.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Each cycle with the edges that close it, for a failing test's message:
/// `a -> b` for every edge inside the cycle.
pub fn describe(graph: &Graph, cycles: &[Vec<String>]) -> String {
    cycles
        .iter()
        .map(|set| {
            let edges: Vec<String> = set
                .iter()
                .flat_map(|a| {
                    graph
                        .get(a)
                        .into_iter()
                        .flatten()
                        .filter(|b| set.contains(b))
                        .map(move |b| format!("{a} -> {b}"))
                })
                .collect();
            format!("[{}]: {}", set.join(", "), edges.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Panics, naming the edges, unless the graph of the crate at `src` has
/// every module of `expected` (so that a moved tree is not read as empty)
/// and no cycle.
pub fn assert_no_cycles(src: &Path, expected: &[&str]) {
    let graph = graph(src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    for module in expected {
        assert!(
            graph.contains_key(*module),
            "no module {module} under {}",
            src.display()
        );
    }
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "modules that import each other: {}",
        describe(&graph, &cycles)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph_of(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry((*a).into()).or_default().insert((*b).into());
            g.entry((*b).into()).or_default();
        }
        g
    }

    #[test]
    fn references_are_read_from_code_not_comments_or_tests() {
        let text = "//! see [`crate::doc`]\nuse crate::{a, b::c, self};\nuse crate::Error;\nfn f() { crate::d::g(); } // crate::comment\n#[cfg(test)]\nmod tests { use crate::t; }\n";
        let got: Vec<String> = references(text).into_iter().collect();
        assert_eq!(got, ["a", "b", "d", "error"]);
    }

    #[test]
    fn cycles_are_found_and_a_dag_has_none() {
        let dag = graph_of(&[("a", "b"), ("b", "c"), ("a", "c")]);
        assert!(cycles(&dag).is_empty());
        let g = graph_of(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "d"),
        ]);
        let mut found = cycles(&g);
        found.sort();
        assert_eq!(found, [vec!["a", "b", "c"], vec!["d", "e"]]);
        assert_eq!(describe(&g, &found[1..]), "[d, e]: d -> e, e -> d");
    }
}
