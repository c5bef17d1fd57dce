//! What the tools' SVG charts share: one font, a text width that never falls short, XML
//! escaping, and a reader of the text a chart drew, for tests.
//!
//! SVG has no layout: a `<text>` is drawn from its anchor whatever its length, and whatever
//! crosses the canvas edge is cut (a right-aligned label wider than its column lost its first
//! letters). So a chart sizes its columns and its canvas from the widths of what it writes:
//! the font is monospace, every character advances the same, and the width of a string is its
//! character count times that advance ([`text_width`]).

/// The font of every chart. Monospace, so that [`text_width`] holds, and the labels line up
/// as in the text tables.
pub const FONT_FAMILY: &str = "DejaVu Sans Mono, Menlo, Consolas, monospace";

/// The advance of one character, in em. DejaVu Sans Mono and Menlo advance 0.602 em, Consolas
/// 0.55 em; 0.62 leaves room for whatever monospace font a viewer substitutes.
pub const CHAR_EM: f64 = 0.62;

/// The width (px) of `s` drawn in [`FONT_FAMILY`] at `font_px`: never less than drawn.
pub fn text_width(s: &str, font_px: f64) -> f64 {
    s.chars().count() as f64 * CHAR_EM * font_px
}

/// `s` as SVG character data or attribute value.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One `<text>` element of a chart, as [`texts`] reads it back.
#[derive(Debug, Clone, PartialEq)]
pub struct Text {
    /// The anchor's x (px).
    pub x: f64,
    /// `start`, `middle` or `end` (`start` when the element does not say).
    pub anchor: String,
    /// Its font size (px): its own `font-size`, else the `<svg>` element's, else 16.
    pub font_px: f64,
    /// What it says, unescaped.
    pub content: String,
}

impl Text {
    /// Left and right edges (px) of the drawn text, by [`text_width`].
    pub fn extent(&self) -> (f64, f64) {
        let w = text_width(&self.content, self.font_px);
        match self.anchor.as_str() {
            "end" => (self.x - w, self.x),
            "middle" => (self.x - w / 2.0, self.x + w / 2.0),
            _ => (self.x, self.x + w),
        }
    }
}

/// The value of attribute `name` in the start tag `tag` (`<text x="1" ...>`), unescaped.
pub fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let at = tag.find(&key)? + key.len();
    let len = tag[at..].find('"')?;
    Some(unescape(&tag[at..at + len]))
}

/// The canvas of a chart: the `<svg>` element's width and height (px).
pub fn canvas(svg: &str) -> Option<(f64, f64)> {
    let tag = start_tags(svg, "svg").next()?;
    Some((attr(tag, "width")?.parse().ok()?, attr(tag, "height")?.parse().ok()?))
}

/// Every start tag `<name ...>` in `svg`, in order.
pub fn start_tags<'a>(svg: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    let open = format!("<{name} ");
    let tags: Vec<&str> = svg
        .match_indices(open.as_str())
        .filter_map(|(at, _)| svg[at..].find('>').map(|end| &svg[at..=at + end]))
        .collect();
    tags.into_iter()
}

/// Every `<text>` of `svg` (for tests: the charts' own output, one element per line or not,
/// no nested elements inside a `<text>`).
pub fn texts(svg: &str) -> Vec<Text> {
    let root_px = start_tags(svg, "svg").next().and_then(|t| attr(t, "font-size")).and_then(|v| v.parse().ok());
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(at) = rest.find("<text ") {
        rest = &rest[at..];
        let (Some(gt), Some(close)) = (rest.find('>'), rest.find("</text>")) else { break };
        let tag = &rest[..=gt];
        out.push(Text {
            x: attr(tag, "x").and_then(|v| v.parse().ok()).unwrap_or(0.0),
            anchor: attr(tag, "text-anchor").unwrap_or_else(|| "start".into()),
            font_px: attr(tag, "font-size").and_then(|v| v.parse().ok()).or(root_px).unwrap_or(16.0),
            content: unescape(&rest[gt + 1..close]),
        });
        rest = &rest[close..];
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_escaping_and_reading_back() {
        assert_eq!(text_width("", 11.0), 0.0);
        assert!((text_width("raw GSO>udpx", 10.0) - 12.0 * 6.2).abs() < 1e-9);
        // Characters, not bytes.
        assert_eq!(text_width("±", 10.0), text_width("x", 10.0));
        let svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"300\" height=\"40\" font-size=\"10\">\n\
             <text x=\"200\" y=\"10\" text-anchor=\"end\">{}</text>\n\
             <text x=\"5\" y=\"30\" font-size=\"13\">{}</text></svg>",
            escape("raw GSO>udpx <&>"),
            escape("a \"b\"")
        );
        assert_eq!(canvas(&svg), Some((300.0, 40.0)));
        let t = texts(&svg);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].content.as_str(), t[0].anchor.as_str(), t[0].font_px), ("raw GSO>udpx <&>", "end", 10.0));
        let (left, right) = t[0].extent();
        assert!((left - (200.0 - 16.0 * 6.2)).abs() < 1e-9 && right == 200.0, "{left} {right}");
        assert_eq!((t[1].content.as_str(), t[1].font_px, t[1].extent().0), ("a \"b\"", 13.0, 5.0));
    }
}
