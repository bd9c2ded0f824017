//! Plain aligned tables, as kubectl prints them.

/// Render rows under a header, columns padded to the widest cell plus three
/// spaces (kubectl's spacing).
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(
        rows.iter()
            .map(|r| line(r.iter().map(String::as_str).collect())),
    );
    out.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn pads_columns_to_widest_cell() {
        let out = render(
            &["NAME", "VERSION"],
            &[
                vec!["a".into(), "1.35.4".into()],
                vec!["longer-name".into(), "1.34.0".into()],
            ],
        );
        assert_eq!(
            out,
            "NAME          VERSION\na             1.35.4\nlonger-name   1.34.0\n"
        );
    }
}
