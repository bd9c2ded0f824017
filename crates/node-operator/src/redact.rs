//! What a host prints is hostile: before any of it leaves the operator (an
//! Event, a status field, an error message, a log line) keys, tokens and
//! passwords are replaced by `[redacted]`. Every function here takes arbitrary
//! text, never panics and never slices a string at an index found in another
//! one: matching is on ASCII letters only, which keeps byte offsets of the
//! original text.

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";

/// Lines of a step's output kept by [`tail`].
pub const TAIL_LINES: usize = 20;

/// Names of `name=value` / `name: value` pairs whose value is a secret, as
/// parts of the name (`client_secret`, `X-Api-Key`, `DB_PASSWORD`).
const SECRET_NAMES: [&str; 10] = [
    "password",
    "passwd",
    "passphrase",
    "token",
    "secret",
    "key",
    "credential",
    "authorization",
    "auth",
    "cookie",
];

/// Authorization schemes whose next word is a credential.
const SCHEMES: [&str; 2] = ["bearer", "basic"];

/// The last [`TAIL_LINES`] lines of a step's output, `stdout` then
/// `stderr`, redacted.
pub fn tail(stdout: &str, stderr: &str) -> String {
    let mut text = stdout.to_string();
    if !stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(stderr);
    }
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(TAIL_LINES);
    // A key block that began above the tail is still redacted: the state is
    // carried through the lines that are not kept.
    let mut in_key = false;
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let redacted = redact_in_block(line, &mut in_key);
        if i >= start {
            out.push(redacted);
        }
    }
    out.join("\n")
}

/// `text` with every line redacted, PEM private-key blocks included.
pub fn text(text: &str) -> String {
    let mut in_key = false;
    text.split('\n')
        .map(|line| redact_in_block(line, &mut in_key))
        .collect::<Vec<_>>()
        .join("\n")
}

fn redact_in_block(line: &str, in_key: &mut bool) -> String {
    if line.contains("-----BEGIN") && contains_ignore_case(line, "key") {
        *in_key = true;
    }
    if *in_key {
        if line.contains("-----END") {
            *in_key = false;
        }
        return REDACTED.to_string();
    }
    self::line(line)
}

/// One line with its secrets replaced: the value of a secret-named pair
/// (and the rest of the line after it), URL user information, the credential
/// after `Bearer`/`Basic`, and words shaped like tokens (bootstrap tokens,
/// JWTs, long base64).
pub fn line(line: &str) -> String {
    let line = userinfo(line);
    if let Some(cut) = secret_pair_value(&line).or_else(|| scheme_credential(&line)) {
        // `cut` is a char boundary of `line` (see the finders).
        let kept = line.get(..cut).unwrap_or_default();
        return format!("{}{REDACTED}", words(kept));
    }
    words(&line)
}

fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'
}

/// Where the value of the first `name=value` / `name: value` pair with a
/// secret name starts (a char boundary), quotes around the name allowed.
fn secret_pair_value(line: &str) -> Option<usize> {
    let mut chars = line.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if !is_name_char(c) {
            continue;
        }
        let mut end = start + c.len_utf8();
        while let Some(&(i, c)) = chars.peek() {
            if !is_name_char(c) {
                break;
            }
            end = i + c.len_utf8();
            chars.next();
        }
        let name = &line[start..end];
        if !SECRET_NAMES.iter().any(|s| contains_ignore_case(name, s)) {
            continue;
        }
        // Closing quote of a quoted name, blanks, then the separator.
        let rest = &line[end..];
        let after_quote = rest.strip_prefix(['"', '\'']).unwrap_or(rest);
        let after_blank = after_quote.trim_start_matches([' ', '\t']);
        let Some(value) = after_blank.strip_prefix(['=', ':']) else {
            continue;
        };
        // `key::` or `a==b` are not pairs; `http://` is not one either.
        if value.starts_with(['=', ':', '/']) {
            continue;
        }
        let value_start = line.len() - value.len();
        let skip = value.len() - value.trim_start_matches([' ', '\t']).len();
        let value_start = value_start + skip;
        if value_start >= line.len() {
            // Nothing after the separator: a heading, not a secret.
            continue;
        }
        return Some(value_start);
    }
    None
}

/// Where the credential after `Bearer ` or `Basic ` starts.
fn scheme_credential(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    for scheme in SCHEMES {
        let n = scheme.len();
        let mut i = 0;
        while i + n < bytes.len() {
            let word_start = i == 0 || !is_name_char(char::from(bytes[i - 1]));
            if word_start
                && bytes[i..i + n].eq_ignore_ascii_case(scheme.as_bytes())
                && bytes[i + n] == b' '
            {
                let mut j = i + n;
                while j < bytes.len() && bytes[j] == b' ' {
                    j += 1;
                }
                // ASCII positions of an ASCII match: char boundaries.
                if j < bytes.len() {
                    return Some(j);
                }
            }
            i += 1;
        }
    }
    None
}

/// `scheme://user:password@host` → `scheme://[redacted]@host`.
fn userinfo(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace() || c == '"')
            .unwrap_or(tail.len());
        let authority = &tail[..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str(REDACTED);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[authority_end..];
    }
    out.push_str(rest);
    out
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "+/=_-.".contains(c)
}

/// Replaces every maximal run of token characters that looks like a secret.
fn words(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut run_start = None;
    for (i, c) in line.char_indices() {
        match (is_token_char(c), run_start) {
            (true, None) => run_start = Some(i),
            (false, Some(s)) => {
                push_word(&mut out, &line[s..i], fingerprint(&line[..s]));
                run_start = None;
                out.push(c);
            }
            (false, None) => out.push(c),
            (true, Some(_)) => {}
        }
    }
    if let Some(s) = run_start {
        push_word(&mut out, &line[s..], fingerprint(&line[..s]));
    }
    out
}

/// Whether the word after `before` is a key fingerprint (`SHA256:…`), which
/// is public and what an operator compares against the host's key.
fn fingerprint(before: &str) -> bool {
    before.ends_with("SHA256:")
}

fn push_word(out: &mut String, word: &str, public: bool) {
    // A sentence's full stop is not part of the token before it.
    let (word, stop) = match word.strip_suffix('.') {
        Some(w) => (w, "."),
        None => (word, ""),
    };
    if !public && looks_like_secret(word) {
        out.push_str(REDACTED);
    } else {
        out.push_str(word);
    }
    out.push_str(stop);
}

/// A bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`), a JWT (`eyJ….….…`), or a
/// long base64 run mixing upper case, lower case and digits. Hex (checksums)
/// and paths are kept: they are what an operator reads output for.
pub fn looks_like_secret(word: &str) -> bool {
    let b = word.as_bytes();
    let lower_alnum = |s: &[u8]| {
        s.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    let bootstrap_token =
        b.len() == 23 && b[6] == b'.' && lower_alnum(&b[..6]) && lower_alnum(&b[7..]);
    let jwt = word.starts_with("eyJ") && word.split('.').count() >= 3;
    let base64ish = b.len() >= 32
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"+/=_-".contains(c))
        && b.iter().any(u8::is_ascii_uppercase)
        && b.iter().any(u8::is_ascii_lowercase)
        && b.iter().any(u8::is_ascii_digit);
    bootstrap_token || jwt || base64ish
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";
    const JWT: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl";

    fn hides(input: &str, secret: &str) {
        let out = line(input);
        assert!(!out.contains(secret), "{input:?} → {out:?}");
        assert!(out.contains(REDACTED), "{input:?} → {out:?}");
    }

    #[test]
    fn non_ascii_output_does_not_panic() {
        // Lower-casing İ makes the text longer: the old code sliced the
        // original at an index found in the lower-cased copy and panicked.
        assert_eq!(line("İİİİ token"), "İİİİ token");
        hides("İİİİ token: hunter2", "hunter2");
        hides("ǅ password=ÿÿÿ", "ÿÿÿ");
        assert_eq!(line("ßẞ Bearer"), "ßẞ Bearer");
    }

    #[test]
    fn secret_pairs_are_hidden() {
        hides("password=hunter2", "hunter2");
        hides("DB_PASSWORD: hunter2", "hunter2");
        hides(r#"{"client_secret": "s3cr3t", "id": 1}"#, "s3cr3t");
        hides("X-Api-Key: abc123", "abc123");
        hides("token = abc", "abc");
        hides("aws_credentials=AKIA", "AKIA");
        hides("'secret':'x1'", "x1");
        hides(&format!("join with token {TOKEN} now"), TOKEN);
        // Not pairs.
        assert_eq!(line("token"), "token");
        assert_eq!(line("key:"), "key:");
        assert_eq!(
            line("host key verification failed"),
            "host key verification failed"
        );
    }

    #[test]
    fn bearer_credentials_are_hidden() {
        hides(r#"curl -H "Authorization: Bearer abc.def""#, "abc.def");
        hides(r#"header "Bearer abc""#, "abc");
        hides("basic dXNlcjpwYXNz", "dXNlcjpwYXNz");
    }

    #[test]
    fn url_userinfo_is_hidden() {
        let out = line("fetching https://user:pa55@example.com/x and http://h/y");
        assert_eq!(
            out,
            "fetching https://[redacted]@example.com/x and http://h/y"
        );
        assert_eq!(line("git@github.com"), "git@github.com");
    }

    #[test]
    fn token_shaped_words_are_hidden() {
        hides(&format!("got {JWT}"), "c2lnbmF0dXJl");
        hides(&format!("({TOKEN})."), TOKEN);
        hides(
            "data QWxhZGRpbjpvcGVuIHNlc2FtZQ1234567890abcdEF",
            "QWxhZGRp",
        );
        let sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(line(&format!("sha256={sha}")), format!("sha256={sha}"));
        let path = "removed /opt/kube-on-kube/packages/containerd-shim-runc-v2";
        assert_eq!(line(path), path);
        let key =
            "the host presented the ED25519 key SHA256:mAcMuPz0G3p4Qk7Yb2Xc9L1vW8sT5nR6dE0fH2jK4aB";
        assert_eq!(line(key), key);
    }

    #[test]
    fn key_blocks_are_hidden_even_when_they_start_above_the_tail() {
        let mut stdout = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
        for _ in 0..30 {
            stdout.push_str("b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n");
        }
        stdout.push_str("-----END OPENSSH PRIVATE KEY-----\nok\n");
        let out = tail(&stdout, "sha256 0123456789abcdef\n");
        assert!(!out.contains("b3Bl"), "{out}");
        assert!(out.ends_with("ok\nsha256 0123456789abcdef"), "{out}");
        assert_eq!(out.lines().count(), TAIL_LINES);
        assert!(
            !text("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nx")
                .contains("MIIE")
        );
    }

    /// Deterministic pseudo-random text over the whole of Unicode, with the
    /// markers the redaction looks for mixed in.
    fn arbitrary_lines(seed: u64, count: usize) -> Vec<String> {
        let mut state = seed;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let pieces = [
            "token",
            "TOKEN",
            " ",
            "=",
            ": ",
            "\"",
            "Bearer ",
            "://",
            "@",
            "/",
            ".",
            "eyJ",
            "-----BEGIN KEY",
            "-----END",
            "İ",
            "ß",
            "\u{0130}\u{0307}",
            "é",
            "\t",
            "'",
        ];
        (0..count)
            .map(|_| {
                let len = next() % 40;
                let mut s = String::new();
                for _ in 0..len {
                    let r = next();
                    if r % 3 == 0 {
                        s.push_str(pieces[(r / 3) as usize % pieces.len()]);
                    } else if let Some(c) = char::from_u32((r >> 8) as u32 % 0x11_0000) {
                        s.push(c);
                    }
                }
                s
            })
            .collect()
    }

    #[test]
    fn arbitrary_unicode_never_panics_and_secrets_stay_hidden() {
        for (i, noise) in arbitrary_lines(0x9e37_79b9_7f4a_7c15, 3000)
            .iter()
            .enumerate()
        {
            let _ = line(noise);
            let _ = text(noise);
            let _ = tail(noise, noise);
            // Whatever comes before, a secret pair is never let through.
            let noise = noise.replace(['\n', '\r'], " ");
            for secret_line in [
                format!("{noise} password=zq{i}Secret"),
                format!("{noise} Authorization: Bearer zq{i}Secret"),
                format!("{noise} https://u:zq{i}Secret@host/"),
            ] {
                let out = line(&secret_line);
                assert!(
                    !out.contains(&format!("zq{i}Secret")),
                    "{secret_line:?} → {out:?}"
                );
            }
        }
    }
}
