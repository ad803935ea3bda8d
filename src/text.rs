//! Text an attacker may choose (process names, paths) on its way to people
//! (issue 18): one sanitizer for human output and log lines, and markup
//! escaping for consumers that render markup. JSON is left exact.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal or a log as it is: C0 and C1
/// controls and DEL (escape sequences retitle, erase and clear a terminal;
/// a newline forges a log line), and the bidirectional overrides and
/// isolates (they reorder what is shown).
fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every control character shown escaped (`\n`, `\x1b`,
/// `\u{202e}`): one line, nothing a terminal or the journal acts on.
pub fn human(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`human`] for multi-line text made of such pieces: each line sanitized,
/// the line breaks kept.
pub fn human_lines(s: &str) -> String {
    s.split('\n').map(human).collect::<Vec<_>>().join("\n")
}

/// Text for a consumer that renders markup (notification bodies, the tray
/// tooltip, waybar's Pango tooltip): [`human_lines`], then `&`, `<`, `>`,
/// `"` and `'` as entities, so `<b>`, `<a href>` and `<img>` show as text.
pub fn markup(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in human_lines(s).chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_shown_escaped() {
        assert_eq!(human("glxgears"), "glxgears");
        assert!(matches!(human("plain"), Cow::Borrowed(_)));
        assert_eq!(human("a\nb"), "a\\nb");
        assert_eq!(human("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(human("x\u{9b}2J"), "x\\x9b2J");
        assert_eq!(human("abc\u{202e}gpj.exe"), "abc\\u{202e}gpj.exe");
        assert_eq!(human("\x7f"), "\\x7f");
        assert_eq!(human_lines("one\ntwo\x1b[2J"), "one\ntwo\\x1b[2J");
    }

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            markup("<b>x</b> & <a href='u'>\n<img src=\"f\">"),
            "&lt;b&gt;x&lt;/b&gt; &amp; &lt;a href=&#39;u&#39;&gt;\n&lt;img src=&quot;f&quot;&gt;"
        );
    }
}
