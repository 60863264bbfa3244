//! Turning positioned glyphs into lines and words.
//!
//! pdf-extract's own `PlainTextOutput` decides on a space only at the first
//! glyph of each text-showing operation. Ghostscript (and so most PDFs made
//! from PostScript) writes the gap between two words inside one string as
//! character spacing (`2.75 Tc (yb) Tj` for "y b"), which that misses:
//! words run together. This output compares every glyph with the end of the
//! previous one instead.

use pdf_extract::{MediaBox, OutputDev, OutputError, Transform};

/// Gap, in font sizes, after which two glyphs on a line are two words.
/// A space is about 0.25 em; kerning and tracking stay well below 0.15.
const WORD_GAP: f64 = 0.15;

/// Collects the text of one page.
#[derive(Default)]
pub struct LineText {
    out: String,
    page_height: f64,
    last: Option<(f64, f64)>,
}

impl LineText {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// The text collected.
    pub fn into_text(self) -> String {
        self.out
    }
}

impl OutputDev for LineText {
    fn begin_page(
        &mut self,
        _page_num: u32,
        media_box: &MediaBox,
        _: Option<(f64, f64, f64, f64)>,
    ) -> Result<(), OutputError> {
        self.page_height = media_box.ury - media_box.lly;
        self.last = None;
        Ok(())
    }

    fn end_page(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn output_character(
        &mut self,
        trm: &Transform,
        width: f64,
        _spacing: f64,
        font_size: f64,
        ch: &str,
    ) -> Result<(), OutputError> {
        // Device position with y growing downwards, and the font size as drawn.
        let x = trm.m31;
        let y = self.page_height - trm.m32;
        let sx = font_size * trm.m11 + font_size * trm.m21;
        let sy = font_size * trm.m12 + font_size * trm.m22;
        let size = (sx * sy).abs().sqrt().max(0.1);
        if let Some((end, last_y)) = self.last {
            let dy = (y - last_y).abs();
            let ends_in_space = self.out.ends_with(char::is_whitespace);
            if dy > size * 1.5 {
                self.out.push_str("\n\n");
            } else if dy > size * 0.5 {
                self.out.push('\n');
            } else if x > end + size * WORD_GAP
                && !ends_in_space
                && !ch.starts_with(char::is_whitespace)
            {
                self.out.push(' ');
            }
        }
        self.out.push_str(ch);
        self.last = Some((x + width * size, y));
        Ok(())
    }

    fn begin_word(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn end_word(&mut self) -> Result<(), OutputError> {
        Ok(())
    }

    fn end_line(&mut self) -> Result<(), OutputError> {
        Ok(())
    }
}

/// Typographic ligatures spelled out, so that "ﬁgure" reads and is found as "figure".
pub fn expand_ligatures(text: &str) -> String {
    if !text.chars().any(|c| ('\u{FB00}'..='\u{FB06}').contains(&c)) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\u{FB00}' => out.push_str("ff"),
            '\u{FB01}' => out.push_str("fi"),
            '\u{FB02}' => out.push_str("fl"),
            '\u{FB03}' => out.push_str("ffi"),
            '\u{FB04}' => out.push_str("ffl"),
            '\u{FB05}' | '\u{FB06}' => out.push_str("st"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ligatures_are_spelled_out() {
        assert_eq!(expand_ligatures("ﬁgure ﬂow eﬀect"), "figure flow effect");
        assert_eq!(expand_ligatures("plain"), "plain");
    }
}
