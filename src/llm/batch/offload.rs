//! Offload: a sequence that must give its pages back has the rows it wrote copied to host
//! memory, and written into the pages it holds when it runs again.

use super::{BatchEngine, Seq};
use crate::llm::graph::labels;
use crate::llm::LlmError;
use crate::runtime::{HostRows, StateRows};

/// A sequence's rows in host memory: the pages they came from by index in its page
/// tables, each with its rows written, and the rows packed layer by layer.
pub(super) struct Offloaded {
    pages: Vec<PageRows>,
    pub(super) host: HostRows,
}

/// Rows `0..rows` of page `index` of a sequence's page table (`local`: the sliding-window
/// layers' table).
#[derive(Clone, Copy)]
struct PageRows {
    index: usize,
    local: bool,
    rows: u64,
}

impl BatchEngine {
    /// The rows of `pages` of sequence `q`, in every layer's key and value states: the
    /// ranges its rows are copied from to the host and written back to (into the pages the
    /// sequence holds then). `None` when a page is not in its tables.
    fn row_ranges(&self, q: &Seq, pages: &[PageRows]) -> Option<Vec<StateRows>> {
        let ps = u64::from(self.options.page_size);
        let c = self.model.config();
        let mut ranges = Vec::new();
        for l in 0..c.num_layers {
            let local = c.is_local(l);
            for state in labels::states_of(l) {
                for r in pages.iter().filter(|r| r.local == local) {
                    let page = if local {
                        q.swa_pages.get(r.index).copied().flatten()?
                    } else {
                        *q.pages.get(r.index)?
                    };
                    ranges.push(StateRows {
                        state,
                        first: u64::from(page) * ps,
                        rows: r.rows,
                    });
                }
            }
        }
        Some(ranges)
    }

    /// Copies the rows sequence `i` wrote to host memory and gives its pages back; `false`
    /// (nothing changed) when the host memory cannot be had. A sequence whose rows are in
    /// host memory already (its restore failed) only gives its pages back.
    pub(super) fn offload(&mut self, i: usize) -> bool {
        let ps = self.options.page_size as usize;
        let q = &self.seqs[i];
        if q.offloaded.is_some() {
            self.give_back_pages(i);
            return true;
        }
        let written = |k: usize| q.done.saturating_sub(k * ps).min(ps) as u64;
        let global = (0..q.pages.len()).map(|k| (k, false));
        let local = (q.swa_pages.iter().enumerate())
            .filter(|(_, p)| p.is_some())
            .map(|(k, _)| (k, true));
        let pages: Vec<PageRows> = global
            .chain(local)
            .map(|(index, local)| PageRows {
                index,
                local,
                rows: written(index),
            })
            .filter(|r| r.rows > 0)
            .collect();
        let Some(ranges) = self.row_ranges(q, &pages) else {
            return false;
        };
        let Ok(host) = self.request.rows_to_host(&ranges) else {
            return false;
        };
        self.seqs[i].offloaded = Some(Offloaded { pages, host });
        self.give_back_pages(i);
        self.stats.offloads += 1;
        let bytes = self.stats().offloaded_bytes;
        self.stats.offloaded_peak_bytes = self.stats.offloaded_peak_bytes.max(bytes);
        true
    }

    /// Writes the rows of sequence `i` that are in host memory into the pages it holds now.
    pub(super) async fn restore(&mut self, i: usize) -> Result<(), LlmError> {
        let q = &self.seqs[i];
        let Some(off) = &q.offloaded else {
            return Ok(());
        };
        let ranges = self
            .row_ranges(q, &off.pages)
            .ok_or(LlmError::BadParameter {
                name: "pages",
                value: q.pages.len().to_string(),
                reason: "a restored sequence lacks a page it had offloaded",
            })?;
        self.request.rows_from_host(&off.host, &ranges).await?;
        self.seqs[i].offloaded = None;
        self.stats.restores += 1;
        Ok(())
    }
}
