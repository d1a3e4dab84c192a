//! Constant tensors of a graph: initializers (inline or external data) and sparse ones.

use bytes::Bytes;

use crate::onnx::external::ExternalRef;
use crate::onnx::tensor::{self, HostTensor, TensorDType, TensorError};

/// Where an initializer's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataLocation {
    /// In the model file (`raw_data` or a typed field).
    Inline,
    /// In a file beside it.
    External(ExternalRef),
}

/// A weight or other constant tensor of a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Initializer {
    /// The value's name.
    pub name: String,
    /// Element type.
    pub dtype: TensorDType,
    /// Dimensions.
    pub dims: Vec<u64>,
    /// Size of the data in bytes.
    pub size_bytes: u64,
    /// Where the data is.
    pub location: DataLocation,
    pub(super) tensor: Option<HostTensor>,
}

impl Initializer {
    /// The tensor; `None` for external data loaded with `read_external: false`.
    pub fn tensor(&self) -> Option<&HostTensor> {
        self.tensor.as_ref()
    }
}

/// A sparse tensor (COO): `values` `[nnz]` at `indices` (`[nnz]` linear or `[nnz, rank]`).
#[derive(Debug, Clone, PartialEq)]
pub struct SparseTensor {
    /// Dense dimensions.
    pub dims: Vec<u64>,
    /// The stored values, `[nnz]`.
    pub values: HostTensor,
    /// Their positions as i64 (validated to be within `dims`).
    pub indices: Vec<i64>,
    /// Whether `indices` are linear offsets (`[nnz]`) rather than coordinates (`[nnz, rank]`).
    pub linear: bool,
}

/// Dense tensors made from sparse ones are limited to this many bytes (1 GiB).
pub const MAX_DENSE_BYTES: u64 = 1 << 30;

impl SparseTensor {
    /// A sparse tensor from its parts, checked: `values` 1-d `[nnz]`, `indices` an integer
    /// tensor `[nnz]` (linear) or `[nnz, rank]`, every index within `dims`.
    ///
    /// # Errors
    /// A description of the first thing wrong.
    pub fn checked(
        dims: Vec<u64>,
        values: HostTensor,
        indices: &HostTensor,
    ) -> Result<Self, String> {
        let [nnz] = values.dims() else {
            return Err(format!("values must be 1-d, are {:?}", values.dims()));
        };
        let nnz = *nnz;
        let rank = dims.len() as u64;
        let linear = match indices.dims() {
            [n] if *n == nnz => true,
            [n, r] if *n == nnz && *r == rank => false,
            other => {
                return Err(format!(
                    "indices must be [{nnz}] or [{nnz}, {rank}], are {other:?}"
                ))
            }
        };
        let indices = indices.to_i64_vec().map_err(|e| format!("indices: {e}"))?;
        let total = tensor::checked_num_elements(&dims).unwrap_or(u64::MAX);
        for (k, &i) in indices.iter().enumerate() {
            let limit = if linear { total } else { dims[k % dims.len()] };
            if i < 0 || i as u64 >= limit {
                return Err(format!("index {i} at {k} is out of range (< {limit})"));
            }
        }
        Ok(SparseTensor {
            dims,
            values,
            indices,
            linear,
        })
    }

    /// The dense tensor (zeros elsewhere). Only for element types of whole bytes.
    ///
    /// # Errors
    /// [`TensorError::NotNumeric`] for strings and sub-byte types, [`TensorError::Overflow`]
    /// when the dense tensor would exceed [`MAX_DENSE_BYTES`].
    pub fn to_dense(&self) -> Result<HostTensor, TensorError> {
        let dtype = self.values.dtype();
        let bits = dtype.bits().filter(|b| b % 8 == 0);
        let (Some(bits), Some(src)) = (bits, self.values.bytes()) else {
            return Err(TensorError::NotNumeric { dtype });
        };
        let (_, size) = HostTensor::expected_bytes(dtype, &self.dims, "sparse")?;
        if size > MAX_DENSE_BYTES {
            return Err(TensorError::Overflow {
                dtype,
                dims: self.dims.clone(),
            });
        }
        let width = bits as usize / 8;
        let mut dense = vec![0u8; size as usize];
        let rank = self.dims.len();
        let nnz = self.values.num_elements() as usize;
        for k in 0..nnz {
            let linear = if self.linear {
                self.indices[k] as usize
            } else {
                self.indices[k * rank..(k + 1) * rank]
                    .iter()
                    .zip(&self.dims)
                    .fold(0usize, |acc, (&i, &d)| acc * d as usize + i as usize)
            };
            dense[linear * width..(linear + 1) * width]
                .copy_from_slice(&src[k * width..(k + 1) * width]);
        }
        HostTensor::from_bytes(dtype, self.dims.clone(), Bytes::from(dense))
    }
}

/// A sparse initializer.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseInitializer {
    /// The value's name (that of its `values` tensor).
    pub name: String,
    /// The tensor.
    pub tensor: SparseTensor,
}
