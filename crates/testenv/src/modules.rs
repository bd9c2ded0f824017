//! The module graph of a crate, read from its sources: which module (one
//! per file: `etcd`, `etcd::spread`) refers to which, through `crate::`,
//! `super::` and `self::` paths and a parent's `child::` paths, outside
//! comments and tests; and the cycles in it, file by file and between
//! top-level modules. The operators' tests assert there are none, so that
//! a module never imports one that calls it, and check their layer rules
//! ([`assert_imports_only`], [`assert_imported_only_by`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module (its path without `crate::`) → the modules it refers to.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The file-level graph of the crate whose `src` directory is `src`. The
/// roots (`lib.rs`, `main.rs`, `bin/`) and test-only files (`tests.rs`,
/// `golden.rs`, and everything after a file's first `#[cfg(test)]`) are
/// left out; the crate's error type re-exported at the root
/// (`crate::Error`) counts as `error`. A path names the longest module it
/// starts with (`crate::etcd::spread::matches` names `etcd::spread`).
pub fn graph(src: &Path) -> std::io::Result<Graph> {
    let mut files = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(module) = module_of(src, &path) {
                files.insert(module, code(&std::fs::read_to_string(&path)?));
            }
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, code) in &files {
        let uses: BTreeSet<String> = references(module, code, &modules)
            .into_iter()
            .filter(|used| used != module)
            .collect();
        graph.insert(module.clone(), uses);
    }
    Ok(graph)
}

/// The graph between top-level modules: `etcd::spread -> render::etcd`
/// is `etcd -> render`.
pub fn top_level(graph: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let mut collapsed = Graph::new();
    for (module, uses) in graph {
        let entry = collapsed.entry(top(module)).or_default();
        for used in uses {
            if top(used) != top(module) {
                entry.insert(top(used));
            }
        }
    }
    collapsed
}

/// The module a source file is, or None for the roots, test-only files
/// and what is not Rust.
fn module_of(src: &Path, path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".rs")?;
    if matches!(stem, "tests" | "golden") {
        return None;
    }
    let relative = path.strip_prefix(src).ok()?;
    let mut parts: Vec<&str> = relative
        .parent()?
        .components()
        .map(|c| c.as_os_str().to_str())
        .collect::<Option<_>>()?;
    if parts.first() == Some(&"bin") {
        return None;
    }
    if stem != "mod" {
        parts.push(stem);
    }
    let module = parts.join("::");
    (!matches!(module.as_str(), "" | "lib" | "main")).then_some(module)
}

/// A file's code before its tests, each line's `//` comment left out.
fn code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or_default();
    before_tests
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of `modules` that `module`'s `code` refers to.
fn references(module: &str, code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let here: Vec<&str> = module.split("::").collect();
    let children = declared_children(code);
    let mut found = BTreeSet::new();
    let resolve = |segments: &[String]| -> Option<String> {
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|candidate| modules.contains(candidate))
    };
    for (at, _) in code.match_indices("::") {
        // The path's first segment: the identifier just before `::`, which
        // must not itself follow `::`.
        let before = &code[..at];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        if before[..start].ends_with("::") {
            continue;
        }
        let first = &before[start..];
        let base: Vec<String> = match first {
            "crate" => Vec::new(),
            "self" => here.iter().map(|s| s.to_string()).collect(),
            "super" => here[..here.len() - 1]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            child if children.contains(child) => here
                .iter()
                .map(|s| s.to_string())
                .chain([child.to_string()])
                .collect(),
            _ => continue,
        };
        for path in paths(&code[at + 2..]) {
            let mut segments = base.clone();
            for segment in path {
                match segment.as_str() {
                    "super" => {
                        segments.pop();
                    }
                    "self" => {}
                    "Error" if segments.is_empty() => segments.push("error".into()),
                    _ => segments.push(segment),
                }
            }
            if segments.is_empty() {
                segments = base.clone();
            }
            found.extend(resolve(&segments));
        }
    }
    found
}

/// The modules `code` declares as its own (`mod child;`).
fn declared_children(code: &str) -> BTreeSet<&str> {
    code.lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub(super) "))
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            line.strip_prefix("mod ")?.strip_suffix(';').map(str::trim)
        })
        .collect()
}

/// The paths that `rest` (the text after `base::`) spells: one for
/// `a::b::c`, one per entry for `a::{b, c::{d, e}}`, each a list of
/// segments.
fn paths(rest: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut end = group.len();
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            let inner = &group[..end];
            let mut entries = Vec::new();
            let (mut depth, mut from) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        entries.push(&inner[from..i]);
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            entries.push(&inner[from..]);
            return entries
                .into_iter()
                .filter(|e| !e.trim().is_empty())
                .flat_map(|entry| {
                    paths(entry).into_iter().map({
                        let segments = segments.clone();
                        move |tail| segments.iter().cloned().chain(tail).collect()
                    })
                })
                .collect();
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        segments.push(name);
        match rest.strip_prefix("::") {
            Some(next) => rest = next.trim_start(),
            None => break,
        }
    }
    vec![segments]
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
/// every top-level module of `expected` (so that a moved tree is not read
/// as empty) and no cycle, neither between files nor between top-level
/// modules.
pub fn assert_no_cycles(src: &Path, expected: &[&str]) {
    let graph = read(src);
    let top = top_level(&graph);
    for module in expected {
        assert!(
            top.contains_key(*module),
            "no module {module} under {}",
            src.display()
        );
    }
    for (what, graph) in [("files", &graph), ("top-level modules", &top)] {
        let cycles = cycles(graph);
        assert!(
            cycles.is_empty(),
            "{what} that import each other: {}",
            describe(graph, &cycles)
        );
    }
}

/// Panics unless every file of `layer` (a module and those under it)
/// refers only to modules under `layer` and under those of `allowed`.
pub fn assert_imports_only(src: &Path, layer: &str, allowed: &[&str]) {
    let graph = read(src);
    let bad: Vec<String> = graph
        .iter()
        .filter(|(module, _)| under(module, layer))
        .flat_map(|(module, uses)| {
            uses.iter()
                .filter(|used| !under(used, layer) && !allowed.iter().any(|a| under(used, a)))
                .map(move |used| format!("{module} -> {used}"))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{layer} may refer only to itself and {allowed:?}: {}",
        bad.join(", ")
    );
}

/// Panics unless `module` (and those under it) is referred to only from
/// under the modules of `by`.
pub fn assert_imported_only_by(src: &Path, module: &str, by: &[&str]) {
    let graph = read(src);
    let bad: Vec<String> = graph
        .iter()
        .filter(|(from, _)| !under(from, module) && !by.iter().any(|b| under(from, b)))
        .flat_map(|(from, uses)| {
            uses.iter()
                .filter(|used| under(used, module))
                .map(move |used| format!("{from} -> {used}"))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "only {by:?} may refer to {module}: {}",
        bad.join(", ")
    );
}

fn read(src: &Path) -> Graph {
    graph(src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()))
}

/// Whether `module` is `parent` or under it.
fn under(module: &str, parent: &str) -> bool {
    module == parent
        || module
            .strip_prefix(parent)
            .is_some_and(|rest| rest.starts_with("::"))
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
        let modules: BTreeSet<String> = [
            "a",
            "b",
            "b::c",
            "d",
            "error",
            "etcd",
            "etcd::spread",
            "etcd::health",
            "etcd::spread::x",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let text = "//! see [`crate::doc`]\nuse crate::{a, b::c::Thing, self};\nuse crate::Error;\nfn f() { crate::d::g(); } // crate::comment\nuse super::{\n    health::Health,\n    self as parent,\n};\nmod x;\nfn g() { x::y(); other::z(); }\n#[cfg(test)]\nmod tests { use crate::t; }\n";
        let got: Vec<String> = references("etcd::spread", &code(text), &modules)
            .into_iter()
            .collect();
        assert_eq!(
            got,
            [
                "a",
                "b::c",
                "d",
                "error",
                "etcd",
                "etcd::health",
                "etcd::spread::x"
            ]
        );
        assert!(references("a", "pub(super) fn f() {}", &modules).is_empty());
    }

    #[test]
    fn files_name_their_modules() {
        let src = Path::new("/s");
        let m = |p: &str| module_of(src, Path::new(p));
        assert_eq!(m("/s/etcd/mod.rs").as_deref(), Some("etcd"));
        assert_eq!(m("/s/etcd/spread.rs").as_deref(), Some("etcd::spread"));
        assert_eq!(m("/s/render.rs").as_deref(), Some("render"));
        for none in [
            "/s/lib.rs",
            "/s/main.rs",
            "/s/etcd/tests.rs",
            "/s/bin/x.rs",
            "/s/a.yaml",
        ] {
            assert_eq!(m(none), None, "{none}");
        }
    }

    #[test]
    fn layers_are_checked_by_prefix() {
        assert!(under("render::etcd", "render"));
        assert!(under("render", "render"));
        assert!(!under("renderer", "render"));
        let g = graph_of(&[("a::b", "a"), ("a", "c::d")]);
        assert_eq!(top_level(&g), graph_of(&[("a", "c")]));
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
