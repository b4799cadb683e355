//! The documentation stays true to the repository: every relative link of README.md,
//! ARCHITECTURE.md, `docs/*.md` and the folder READMEs names a file that exists (and a
//! heading that exists, for `#anchor` links), no page cites a file that is not in the
//! repository, and README.md stays short.
//!
//! Links inside fenced code blocks and inline code spans are not links and are ignored.
//! Only ATX headings (`# Title`) make anchors, with GitHub's slugs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// README.md must stay under this many bytes: it is the page for users, the rest is in
/// `docs/`.
const README_MAX_BYTES: usize = 10 * 1024;

/// Text no page may contain: files that are not part of the repository.
const FORBIDDEN: [&str; 3] = ["../shared", "DESIGN.md", "DEPENDENCIES.md"];

/// One Markdown link: where it is and what it points at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    /// 1-based line number in its page.
    line: usize,
    /// The link text.
    text: String,
    /// The target as written.
    target: String,
}

/// The workspace root: the parent of this crate's folder (`tests/`).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The pages checked, relative to the root: README.md, ARCHITECTURE.md, every
/// `docs/*.md` and the folder READMEs that exist.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
                .filter_map(|path| path.strip_prefix(root).ok().map(Path::to_path_buf))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    pages.extend(docs);
    for folder in ["deploy", "services", "tests"] {
        let readme = Path::new(folder).join("README.md");
        if root.join(&readme).is_file() {
            pages.push(readme);
        }
    }
    pages
}

/// Whether `line` opens or closes a fenced code block (three or more backticks or
/// tildes, indented by at most three spaces).
fn is_fence(line: &str) -> bool {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = line.trim_start_matches(' ');
    indent <= 3 && (rest.starts_with("```") || rest.starts_with("~~~"))
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if is_fence(line) {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// `line` with its inline code spans (`` `like this` ``) replaced by their text, minus
/// brackets and parentheses, so that code never reads as a link while a link's text
/// stays readable. An unclosed backtick run is kept as text, as Markdown does.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let run = after.len() - after.trim_start_matches('`').len();
        let fence = &after[..run];
        let body = &after[run..];
        match body.find(fence) {
            Some(end) => {
                out.extend(body[..end].chars().map(|c| match c {
                    '[' | ']' | '(' | ')' => ' ',
                    c => c,
                }));
                rest = &body[end + run..];
            }
            None => {
                out.push_str(fence);
                rest = body;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The inline links `[text](target)` (and images) of one line of prose. A target in
/// angle brackets loses them; a title after the target (`(file.md "title")`) is dropped.
fn inline_links(line: &str) -> Vec<(String, String)> {
    let mut links = Vec::new();
    let bytes = line.as_bytes();
    let mut search = 0;
    while let Some(found) = line[search..].find("](") {
        let close = search + found;
        search = close + 2;
        // The text: back to the `[` that opens it, allowing nested brackets.
        let mut depth = 0usize;
        let mut open = None;
        for (index, byte) in bytes[..close].iter().enumerate().rev() {
            match *byte {
                b']' => depth += 1,
                b'[' if depth == 0 => {
                    open = Some(index);
                    break;
                }
                b'[' => depth -= 1,
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        // The target: up to the `)` that closes it, allowing balanced parentheses.
        let start = close + 2;
        let mut depth = 0usize;
        let mut end = None;
        for (offset, byte) in line[start..].bytes().enumerate() {
            match byte {
                b'(' => depth += 1,
                b')' if depth == 0 => {
                    end = Some(start + offset);
                    break;
                }
                b')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { continue };
        let raw = line[start..end].trim();
        let target = if let Some(inner) = raw.strip_prefix('<') {
            inner.split('>').next().unwrap_or_default()
        } else {
            raw.split_whitespace().next().unwrap_or_default()
        };
        links.push((line[open + 1..close].to_owned(), target.to_owned()));
        search = end + 1;
    }
    links
}

/// A reference definition `[label]: target` on its own line, if `line` is one.
fn reference_definition(line: &str) -> Option<(String, String)> {
    let rest = line.trim_start();
    let rest = rest.strip_prefix('[')?;
    let (label, after) = rest.split_once("]:")?;
    if label.is_empty() || label.contains(']') {
        return None;
    }
    let target = after.split_whitespace().next()?;
    let target = target.trim_start_matches('<').trim_end_matches('>');
    Some((label.to_owned(), target.to_owned()))
}

/// Every link of a page, outside code.
fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (line, content) in prose_lines(text) {
        let prose = without_code_spans(content);
        if let Some((text, target)) = reference_definition(&prose) {
            found.push(Link { line, text, target });
            continue;
        }
        for (text, target) in inline_links(&prose) {
            found.push(Link { line, text, target });
        }
    }
    found
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, every other character
/// dropped unless it is a letter, a digit, `-` or `_`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The text of an ATX heading (`## Title ##`), if `line` is one.
fn heading(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = line.trim_start_matches(' ');
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let body = &rest[hashes..];
    if !(body.is_empty() || body.starts_with(' ') || body.starts_with('\t')) {
        return None;
    }
    let body = body.trim();
    // A closing run of `#` is not part of the heading when a space precedes it.
    let trimmed = body.trim_end_matches('#');
    let body = if trimmed.is_empty() || trimmed.ends_with(' ') {
        trimmed.trim_end()
    } else {
        body
    };
    Some(body)
}

/// The anchors of a page, as GitHub makes them: a repeated slug gets `-1`, `-2`, ….
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = Vec::new();
    for (_, line) in prose_lines(text) {
        let Some(title) = heading(line) else { continue };
        let base = slug(title);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push(if *count == 0 {
            base
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// Whether a link goes outside the repository, where this test does not follow it.
fn is_external(target: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:")
}

/// `%20` and friends decoded; anything malformed is left as written.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == b'%'
            && let Some(hex) = text.get(index + 1..index + 3)
            && let Ok(value) = u8::from_str_radix(hex, 16)
        {
            out.push(value);
            index += 3;
            continue;
        }
        out.push(byte);
        index += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

/// `path` with its `.` and `..` components folded away, as far as they go (for messages
/// and for comparing pages).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                let climbs = out.as_os_str().is_empty() || out.ends_with("..");
                if climbs || !out.pop() {
                    out.push("..");
                }
            }
            std::path::Component::Normal(_)
            | std::path::Component::RootDir
            | std::path::Component::Prefix(_) => out.push(part),
        }
    }
    out
}

/// Why `link` of the page `page` (relative to `root`) does not resolve, if it does not.
fn broken(root: &Path, page: &Path, page_text: &str, link: &Link) -> Option<String> {
    let target = link.target.as_str();
    if is_external(target) {
        return None;
    }
    if target.is_empty() {
        return Some("the target is empty".to_owned());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let (file, text) = if path.is_empty() {
        (page.to_path_buf(), page_text.to_owned())
    } else {
        let folder = page.parent().unwrap_or(Path::new(""));
        let file = normalized(&folder.join(percent_decoded(path)));
        let full = root.join(&file);
        if !full.exists() {
            return Some(format!(
                "{} does not exist (resolved from {})",
                file.display(),
                page.display()
            ));
        }
        // A link to a file without an anchor needs nothing more.
        anchor?;
        match std::fs::read_to_string(&full) {
            Ok(text) => (file, text),
            Err(error) => {
                return Some(format!(
                    "the anchor needs a Markdown file, and {} cannot be read: {error}",
                    file.display()
                ));
            }
        }
    };
    let anchor = anchor?;
    let wanted = percent_decoded(anchor).to_lowercase();
    if anchors(&text).contains(&wanted) {
        return None;
    }
    Some(format!(
        "{} has no heading whose anchor is #{wanted}",
        file.display()
    ))
}

/// Every problem of one page: broken links, forbidden text, README's size.
fn page_problems(root: &Path, page: &Path) -> Vec<String> {
    let text = match std::fs::read_to_string(root.join(page)) {
        Ok(text) => text,
        Err(error) => return vec![format!("{}: cannot be read: {error}", page.display())],
    };
    let mut problems = Vec::new();
    for link in links(&text) {
        if let Some(why) = broken(root, page, &text, &link) {
            problems.push(format!(
                "{}:{}: link [{}]({}): {why}",
                page.display(),
                link.line,
                link.text,
                link.target
            ));
        }
    }
    for (line, content) in text.lines().enumerate() {
        for forbidden in FORBIDDEN {
            if content.contains(forbidden) {
                problems.push(format!(
                    "{}:{}: mentions {forbidden}, which is not part of the repository",
                    page.display(),
                    line + 1
                ));
            }
        }
    }
    if page == Path::new("README.md") && text.len() >= README_MAX_BYTES {
        problems.push(format!(
            "README.md: {} bytes, but it must stay under {README_MAX_BYTES}; move detail to docs/",
            text.len()
        ));
    }
    problems
}

#[test]
fn every_page_links_only_to_what_exists_and_cites_nothing_outside() {
    let root = workspace_root();
    let pages = pages(&root);
    assert!(
        pages.iter().any(|p| p.starts_with("docs")),
        "no docs/*.md found under {}",
        root.display()
    );
    let problems: Vec<String> = pages.iter().flat_map(|p| page_problems(&root, p)).collect();
    assert!(
        problems.is_empty(),
        "{} problem(s) in the docs:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Every file of the repository's own text (sources, manifests, contracts, pages,
/// scripts), relative to `root`; build output, installed npm packages and git's folder
/// are not the repository.
fn repository_texts(root: &Path, folder: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(folder)) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let relative = folder.join(entry.file_name());
        let name = entry.file_name();
        if entry.path().is_dir() {
            if !matches!(
                name.to_str(),
                Some("target" | ".git" | ".agentloop" | "node_modules")
            ) {
                repository_texts(root, &relative, found);
            }
        } else if relative == Path::new(".ci/run")
            || relative
                .extension()
                .and_then(|ext| ext.to_str())
                .is_some_and(|ext| {
                    matches!(ext, "rs" | "toml" | "proto" | "md" | "sh" | "yaml" | "py")
                })
        {
            found.push(relative);
        }
    }
}

#[test]
fn no_file_cites_one_outside_the_repository() {
    let root = workspace_root();
    let mut texts = Vec::new();
    repository_texts(&root, Path::new(""), &mut texts);
    assert!(texts.iter().any(|p| p.ends_with("Cargo.toml")), "{texts:?}");
    let this_file = Path::new("tests/tests/docs.rs");
    let mut problems = Vec::new();
    for path in texts.iter().filter(|p| p.as_path() != this_file) {
        let Ok(text) = std::fs::read_to_string(root.join(path)) else {
            continue;
        };
        for (line, content) in text.lines().enumerate() {
            for forbidden in FORBIDDEN.iter().filter(|f| content.contains(*f)) {
                problems.push(format!(
                    "{}:{}: cites {forbidden}",
                    path.display(),
                    line + 1
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "files cite what is not in the repository:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_under_ten_kib() {
    let root = workspace_root();
    let size = std::fs::metadata(root.join("README.md")).map(|m| m.len());
    let size = size.expect("README.md must exist at the workspace root");
    assert!(
        size < 10 * 1024,
        "README.md is {size} bytes; it must stay under {README_MAX_BYTES}"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Quick start"), "quick-start");
    assert_eq!(slug("The `agentloop` command"), "the-agentloop-command");
    assert_eq!(
        slug("Prices and the cost budget"),
        "prices-and-the-cost-budget"
    );
    assert_eq!(slug("Exit codes (of the CLI)"), "exit-codes-of-the-cli");
    assert_eq!(
        slug("snake_case and kebab-case"),
        "snake_case-and-kebab-case"
    );
    assert_eq!(slug("A, B & C: done."), "a-b--c-done");
}

#[test]
fn headings_and_repeated_anchors() {
    assert_eq!(heading("## Status"), Some("Status"));
    assert_eq!(heading("### Closed ###"), Some("Closed"));
    assert_eq!(heading("#hashtag"), None);
    assert_eq!(heading("    # indented code"), None);
    let text = "# Title\n## Usage\n```\n# not a heading\n```\n## Usage\n";
    assert_eq!(anchors(text), ["title", "usage", "usage-1"]);
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "See [the CLI](docs/cli.md#exit-codes) and [x](<a b.md> \"t\").\n\
                ```\n[in a fence](nowhere.md)\n```\n\
                Inline `[code](nowhere.md)` is not a link; [ok](#top).\n\
                [ref]: docs/models.md\n";
    let found: Vec<(usize, String)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (1, "docs/cli.md#exit-codes".to_owned()),
            (1, "a b.md".to_owned()),
            (5, "#top".to_owned()),
            (6, "docs/models.md".to_owned()),
        ]
    );
    assert_eq!(
        inline_links(&without_code_spans("[`code` text](f.md)")),
        [("code text".to_owned(), "f.md".to_owned())]
    );
    assert_eq!(
        normalized(Path::new("docs/../deploy/./x.toml")),
        Path::new("deploy/x.toml")
    );
    assert_eq!(normalized(Path::new("../../x.md")), Path::new("../../x.md"));
    assert_eq!(
        inline_links("[a [nested] text](f.md) then [b](g.md)"),
        [
            ("a [nested] text".to_owned(), "f.md".to_owned()),
            ("b".to_owned(), "g.md".to_owned())
        ]
    );
}

#[test]
fn a_broken_link_or_anchor_is_reported() {
    let root = workspace_root();
    let page = Path::new("README.md");
    let text = "# Here\n";
    let link = |target: &str| Link {
        line: 1,
        text: "t".to_owned(),
        target: target.to_owned(),
    };
    assert_eq!(broken(&root, page, text, &link("#here")), None);
    assert_eq!(
        broken(&root, page, text, &link("https://example.com/x")),
        None
    );
    assert_eq!(broken(&root, page, text, &link("ARCHITECTURE.md")), None);
    let missing = broken(&root, page, text, &link("docs/no-such-page.md"));
    assert!(missing.is_some_and(|why| why.contains("does not exist")));
    let anchor = broken(&root, page, text, &link("#not-here"));
    assert!(anchor.is_some_and(|why| why.contains("#not-here")));
    let remote_anchor = broken(&root, page, text, &link("ARCHITECTURE.md#no-such-heading"));
    assert!(remote_anchor.is_some_and(|why| why.contains("ARCHITECTURE.md")));
}
