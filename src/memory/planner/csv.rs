//! The MiniMalloc CSV format: a header `id,lower,upper,size[,alignment]` (columns in any order;
//! an `offset` column is accepted and ignored), then one buffer per row. A solution is the same
//! rows with an `offset` column added.

use super::{PlanBuffer, PlanError};
use std::collections::HashSet;

/// Parses buffers from MiniMalloc CSV text.
///
/// # Errors
/// [`PlanError::BadHeader`] when a required column is missing; [`PlanError::BadRow`] naming the
/// line for a missing or extra field, a non-numeric or negative number, `upper <= lower`, a
/// zero alignment or a duplicate id.
pub fn parse_csv(text: &str) -> Result<Vec<PlanBuffer>, PlanError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Err(PlanError::BadHeader {
            reason: "the file is empty".into(),
        });
    };
    let cols: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let find = |name: &str| cols.iter().position(|c| c == name);
    let col = |name: &str| {
        find(name).ok_or_else(|| PlanError::BadHeader {
            reason: format!("no `{name}` column"),
        })
    };
    let (ci, cl, cu, cs) = (col("id")?, col("lower")?, col("upper")?, col("size")?);
    let ca = find("alignment");
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for (k, line) in lines {
        let line_no = k + 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != cols.len() {
            return Err(PlanError::BadRow {
                line: line_no,
                reason: format!("{} fields, the header has {}", fields.len(), cols.len()),
            });
        }
        let id = fields[ci].to_string();
        if id.is_empty() {
            return Err(PlanError::BadRow {
                line: line_no,
                reason: "empty id".into(),
            });
        }
        let num = |c: usize, name: &str| -> Result<u64, PlanError> {
            let f = fields[c];
            if f.starts_with('-') {
                return Err(PlanError::BadRow {
                    line: line_no,
                    reason: format!("buffer `{id}`: {name} `{f}` is negative"),
                });
            }
            f.parse::<u64>().map_err(|_| PlanError::BadRow {
                line: line_no,
                reason: format!("buffer `{id}`: {name} `{f}` is not a non-negative integer"),
            })
        };
        let lower = num(cl, "lower")?;
        let upper = num(cu, "upper")?;
        let size_bytes = num(cs, "size")?;
        let align_bytes = match ca {
            Some(c) => num(c, "alignment")?,
            None => 1,
        };
        if upper <= lower {
            return Err(PlanError::BadRow {
                line: line_no,
                reason: format!("buffer `{id}`: upper {upper} must be greater than lower {lower}"),
            });
        }
        if align_bytes == 0 {
            return Err(PlanError::BadRow {
                line: line_no,
                reason: format!("buffer `{id}`: alignment must be at least 1"),
            });
        }
        if !seen.insert(id.clone()) {
            return Err(PlanError::BadRow {
                line: line_no,
                reason: format!("duplicate id `{id}`"),
            });
        }
        out.push(PlanBuffer {
            id,
            lower,
            upper,
            size_bytes,
            align_bytes,
        });
    }
    Ok(out)
}

/// Writes a solution: `id,lower,upper,size[,alignment],offset` (alignment only when some
/// buffer has one other than 1).
pub fn write_csv(buffers: &[PlanBuffer], offsets: &[u64]) -> String {
    let with_align = buffers.iter().any(|b| b.align_bytes != 1);
    let mut s = String::from(if with_align {
        "id,lower,upper,size,alignment,offset\n"
    } else {
        "id,lower,upper,size,offset\n"
    });
    for (b, o) in buffers.iter().zip(offsets) {
        if with_align {
            s.push_str(&format!(
                "{},{},{},{},{},{}\n",
                b.id, b.lower, b.upper, b.size_bytes, b.align_bytes, o
            ));
        } else {
            s.push_str(&format!(
                "{},{},{},{},{}\n",
                b.id, b.lower, b.upper, b.size_bytes, o
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        let b = parse_csv("id,lower,upper,size,alignment\nb1,0,3,4,2\n\nb2,3,9,4,1\n").unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(
            b[0],
            PlanBuffer {
                id: "b1".into(),
                lower: 0,
                upper: 3,
                size_bytes: 4,
                align_bytes: 2
            }
        );
        let out = write_csv(&b, &[0, 4]);
        assert!(out.starts_with("id,lower,upper,size,alignment,offset\nb1,0,3,4,2,0\n"));
        let again = parse_csv(&out).unwrap();
        assert_eq!(again, b);
    }

    #[test]
    fn malformed_rows_name_the_line() {
        let cases = [
            ("id,lower,upper,size\na,0,1\n", "line 2"),
            ("id,lower,upper,size\na,0,1,-4\n", "negative"),
            ("id,lower,upper,size\na,0,1,4\nb,3,3,4\n", "line 3"),
            (
                "id,lower,upper,size\na,0,1,4\na,1,2,4\n",
                "duplicate id `a`",
            ),
            ("id,lower,upper,size\na,0,x,4\n", "upper `x`"),
        ];
        for (text, want) in cases {
            let e = parse_csv(text).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        }
        assert!(matches!(
            parse_csv("id,lower,size\n"),
            Err(PlanError::BadHeader { .. })
        ));
        assert!(matches!(parse_csv(""), Err(PlanError::BadHeader { .. })));
    }
}
