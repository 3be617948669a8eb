//! The import graph of a crate's files, and the check that holds them in
//! layers: no file imports back up into one that imports it, and there is
//! no circle across files.
//!
//! The graph has an edge from a file to each file whose items it names:
//! `use` declarations, re-exports and paths alike (`crate::x`, `super::x`,
//! `self::x`, a child module's `x::`), test modules included. A layering is
//! a list of layers from the bottom up, each a list of module prefixes; a
//! file belongs to the first layer one of whose prefixes names its module
//! (`snap` covers `snap::nvme`; `""` is `lib.rs` alone). An edge may go
//! down, or sideways within a layer, never up; and sideways edges must not
//! close a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// From the bottom up: each layer's name and its module prefixes.
pub type Layers<'a> = &'a [(&'a str, &'a [&'a str])];

/// Panics, listing every upward edge and every circle, unless the files
/// under `src` import in `layers`; prints the graph and its layers (run a
/// test with `--nocapture` to see them).
pub fn assert_layered(src: &Path, layers: Layers) {
    let files = modules(src);
    assert!(
        files.len() > 30,
        "found {} files under {}",
        files.len(),
        src.display()
    );
    let edges: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|(module, path)| (module.clone(), imports(module, path, &files)))
        .collect();

    let layer_of = |module: &str| -> usize {
        layers
            .iter()
            .position(|(_, prefixes)| {
                prefixes.iter().any(|p| {
                    module == *p || (!p.is_empty() && module.starts_with(&format!("{p}::")))
                })
            })
            .unwrap_or_else(|| panic!("{} is in no layer", name(module)))
    };
    let mut upward = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            if layer_of(to) > layer_of(from) {
                upward.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    let circles = circles(&edges);

    for (i, (what, _)) in layers.iter().enumerate() {
        let members: Vec<&str> = files
            .keys()
            .filter(|m| layer_of(m) == i)
            .map(|m| name(m))
            .collect();
        println!("layer {i} ({what}): {}", members.join(" "));
    }
    for (from, tos) in &edges {
        let tos: Vec<&str> = tos.iter().map(|t| name(t)).collect();
        println!("{} -> {}", name(from), tos.join(", "));
    }
    let count: usize = edges.values().map(BTreeSet::len).sum();
    println!(
        "{} files, {count} edges, {} upward, {} circles",
        files.len(),
        upward.len(),
        circles.len()
    );
    assert!(upward.is_empty(), "upward edges: {upward:#?}");
    assert!(circles.is_empty(), "circles: {circles:#?}");
}

fn name(module: &str) -> &str {
    if module.is_empty() { "lib" } else { module }
}

/// Every `.rs` file under `src` by its module path (`lib.rs` is `""`);
/// `main.rs` is the binary, not the library.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            match parts.as_slice() {
                [only] if only == "main" => continue,
                [only] if only == "lib" => parts.clear(),
                [.., last] if last == "mod" => {
                    parts.pop();
                }
                _ => {}
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The files `module` (at `path`) names.
fn imports(module: &str, path: &Path, files: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let text = blank_comments_and_literals(&std::fs::read_to_string(path).unwrap());
    let me: Vec<String> = split(module);
    let parent: Vec<String> = me[..me.len().saturating_sub(1)].to_vec();
    let children = declared_modules(&text);
    let inline = inline_module_spans(&text);

    let mut paths: Vec<(usize, Vec<String>)> = Vec::new();
    for (at, tree) in use_trees(&text) {
        for p in expand(&tree) {
            paths.push((at, p));
        }
    }
    for (at, p) in qualified_paths(&text, &children) {
        paths.push((at, p));
    }

    let mut out = BTreeSet::new();
    for (at, p) in paths {
        let Some(first) = p.first() else { continue };
        let target: Vec<String> = match first.as_str() {
            "crate" => p[1..].to_vec(),
            // `super` inside an inline module (`mod tests { .. }`) is this file.
            "super" if inline.iter().any(|(a, b)| (*a..*b).contains(&at)) => {
                me.iter().chain(&p[1..]).cloned().collect()
            }
            "super" => {
                let mut base = parent.clone();
                let mut rest = &p[1..];
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                base.into_iter().chain(rest.iter().cloned()).collect()
            }
            "self" => me.iter().chain(&p[1..]).cloned().collect(),
            child if children.contains(child) => me.iter().chain(&p).cloned().collect(),
            _ => continue,
        };
        let file = (0..=target.len())
            .rev()
            .map(|n| target[..n].join("::"))
            .find(|m| files.contains_key(m))
            .unwrap_or_default();
        if file != module {
            out.insert(file);
        }
    }
    out
}

fn split(module: &str) -> Vec<String> {
    if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    }
}

/// The source with comments, strings and char literals blanked (same
/// length, so positions keep their meaning).
fn blank_comments_and_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !ident(i) && raw_string_start(&b[i..]).is_some() {
            let (open, hashes) = raw_string_start(&b[i..]).unwrap();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = b[i + open..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |n| i + open + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|n| i + 2 + n)
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end + 1);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// `r"`, `r#"`, `br"` ...: the length of the opening and the number of `#`.
fn raw_string_start(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    if b.first() == Some(&b'b') {
        i += 1;
    }
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
    (b.get(i + hashes) == Some(&b'"')).then_some((i + hashes + 1, hashes))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `mod x;` declarations: this file's child modules.
fn declared_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices("mod ") {
        if at > 0 && is_ident(text[..at].chars().next_back().unwrap()) {
            continue;
        }
        let rest = &text[at + 4..];
        let ident: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if !ident.is_empty() && rest[ident.len()..].trim_start().starts_with(';') {
            out.insert(ident);
        }
    }
    out
}

/// Where each inline module (`mod tests { .. }`) starts and ends.
fn inline_module_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        if at > 0 && is_ident(text[..at].chars().next_back().unwrap()) {
            continue;
        }
        let rest = &text[at + 4..];
        let ident: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        let after = rest[ident.len()..].trim_start();
        if ident.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = text.len() - after.len();
        let mut depth = 0;
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((at, open + i));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every `use` declaration's tree, with where it is.
fn use_trees(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("use ") {
        if at > 0 && is_ident(text[..at].chars().next_back().unwrap()) {
            continue;
        }
        if let Some(end) = text[at..].find(';') {
            out.push((at, text[at + 4..at + end].to_owned()));
        }
    }
    out
}

/// `a::{b, c::{d, e as f}}` as paths.
fn expand(tree: &str) -> Vec<Vec<String>> {
    // `x as y` keeps only `x`: marked, then the spaces go.
    let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree: String = tree
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let mut out = Vec::new();
    expand_into(&[], &tree, &mut out);
    out
}

fn expand_into(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    for item in split_top_level(tree) {
        if item.is_empty() {
            continue;
        }
        if let Some(open) = item.find('{') {
            let head: Vec<String> = item[..open]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let inner = &item[open + 1..item.len() - 1];
            let prefix: Vec<String> = prefix.iter().cloned().chain(head).collect();
            expand_into(&prefix, inner, out);
        } else {
            let item = item.split('@').next().unwrap_or(item);
            out.push(
                prefix
                    .iter()
                    .cloned()
                    .chain(
                        item.split("::")
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned),
                    )
                    .collect(),
            );
        }
    }
}

fn split_top_level(tree: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&tree[start..]);
    out
}

/// Paths used in code: `crate::..`, `super::..`, `self::..`, or a child
/// module's `x::..`.
fn qualified_paths(text: &str, children: &BTreeSet<String>) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts_word =
            is_ident(b[i] as char) && (i == 0 || !(is_ident(b[i - 1] as char) || b[i - 1] == b':'));
        if !starts_word {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut segments = Vec::new();
        loop {
            let start = j;
            while j < b.len() && is_ident(b[j] as char) {
                j += 1;
            }
            segments.push(text[start..j].to_owned());
            if b[j..].starts_with(b"::") && b.get(j + 2).is_some_and(|&c| is_ident(c as char)) {
                j += 2;
            } else {
                break;
            }
        }
        let first = segments[0].as_str();
        if segments.len() > 1
            && (matches!(first, "crate" | "super" | "self") || children.contains(first))
        {
            out.push((i, segments));
        }
        i = j.max(i + 1);
    }
    out
}

/// The circles of the graph: its strongly connected parts of more than
/// one file (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
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
                let mut part = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    part.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if part.len() > 1 {
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}
