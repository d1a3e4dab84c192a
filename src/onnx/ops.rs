//! Which ONNX opsets the loader accepts, and which definition of an op a model's opset
//! selects. Which ops the importer maps is its converter registry's to say
//! ([`super::import::CONVERTERS`], [`is_supported`]).

use std::ops::RangeInclusive;

use super::schemas;

/// Opset versions of the default domain (`""` / `ai.onnx`) that the loader accepts: 1 to the
/// newest opset whose operator definitions `onnx==1.22.0` (whose backend node tests are the
/// yardstick) knows, 27. A later opset may have changed an op in a way dynrt cannot know of,
/// so it is refused ([`crate::onnx::OnnxError::UnsupportedOpset`]). Which definition of an
/// op a model gets is per op: [`op_version`].
pub const DEFAULT_DOMAIN_OPSETS: RangeInclusive<i64> = 1..=schemas::MAX_OPSET;

/// The definition of `op_type` (default domain) in effect at `opset`: the newest
/// `since_version` at or below it (ONNX's rule). `None` when the op is not in the ONNX
/// schema table or did not exist yet at that opset.
///
/// ```
/// use dynrt::onnx::ops::op_version;
/// assert_eq!(op_version("Softmax", 17), Some(13));
/// assert_eq!(op_version("ReduceMean", 17), Some(13));
/// assert_eq!(op_version("ReduceMean", 18), Some(18));
/// assert_eq!(op_version("Gelu", 17), None); // Gelu arrived in opset 20
/// ```
pub fn op_version(op_type: &str, opset: i64) -> Option<i64> {
    let i = schemas::SINCE_VERSIONS
        .binary_search_by(|(name, _)| name.cmp(&op_type))
        .ok()?;
    schemas::SINCE_VERSIONS[i]
        .1
        .iter()
        .rev()
        .find(|&&v| v <= opset)
        .copied()
}

/// Whether the importer maps `op_type` of `domain` (`""` or `ai.onnx` for the default one,
/// `com.microsoft` for ONNX Runtime's contrib ops): whether the converter registry of the
/// domain ([`super::import::CONVERTERS`], [`super::import::CONTRIB_CONVERTERS`]) has a line
/// for it.
pub fn is_supported(domain: &str, op_type: &str) -> bool {
    super::import::converter_in(domain, op_type).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_is_the_registry() {
        assert!(is_supported("", "MatMul"));
        assert!(is_supported("ai.onnx", "Softmax"));
        assert!(!is_supported("com.microsoft", "MatMul"));
        assert!(is_supported("com.microsoft", "MatMulNBits"));
        assert!(!is_supported("", "MatMulNBits") && !is_supported("x.y", "MatMulNBits"));
        assert!(!is_supported("", "NonMaxSuppression"));
        assert!(DEFAULT_DOMAIN_OPSETS.contains(&13) && DEFAULT_DOMAIN_OPSETS.contains(&21));
    }

    #[test]
    fn schema_table_is_sorted_and_covers_the_importer() {
        let t = schemas::SINCE_VERSIONS;
        assert!(t.len() > 150, "{} ops", t.len());
        assert!(
            t.windows(2).all(|w| w[0].0 < w[1].0),
            "table sorted by name"
        );
        assert!(t
            .iter()
            .all(|(_, v)| !v.is_empty() && v.windows(2).all(|w| w[0] < w[1])));
        for c in super::super::import::CONVERTERS {
            assert!(
                op_version(c.op_type, schemas::MAX_OPSET).is_some(),
                "{} not in the schema table",
                c.op_type
            );
            assert!(
                op_version(c.op_type, c.since) == Some(c.since),
                "{}: {} is not one of its definitions",
                c.op_type,
                c.since
            );
        }
        assert_eq!(op_version("Add", 13), Some(13));
        assert_eq!(op_version("Add", 12), Some(7));
        assert_eq!(op_version("Not", 1), Some(1));
        assert_eq!(op_version("NoSuchOp", 13), None);
    }
}
