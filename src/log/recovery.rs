//! Recovery scan: walks stored batches, checking each one's length, CRC-32C
//! and offset continuity, and reports where the longest valid prefix ends.
//! Pure over byte slices so that it can be property-tested and fuzzed; the
//! log feeds it the tail of its last segment chunk by chunk.

use crate::protocol::record_batch::{self, BatchHeader};

/// A batch found intact by the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScannedBatch {
    /// Position of the batch relative to the start of the scanned slice.
    pub position: usize,
    pub header: BatchHeader,
}

/// Why a scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanStop {
    /// Ran out of bytes exactly at a batch boundary.
    End,
    /// The next batch extends past the slice: read more from `position`, or
    /// truncate there if the file ends.
    Incomplete { position: usize, needed_bytes: usize },
    /// The bytes at `position` are not a valid next batch (torn, corrupt,
    /// zeros from pre-allocation, or an offset that breaks continuity).
    Invalid { position: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    pub batches: Vec<ScannedBatch>,
    pub next_offset: i64,
    pub stop: ScanStop,
}

impl Scan {
    /// Bytes of the slice that hold valid batches.
    pub fn valid_bytes(&self) -> usize {
        self.batches.last().map_or(0, |b| b.position + b.header.size_bytes)
    }
}

/// Scans `data` as consecutive batches, the first expected at `next_offset`.
pub fn scan(data: &[u8], mut next_offset: i64, batch_bytes_max: usize) -> Scan {
    let mut batches = Vec::new();
    let mut position = 0usize;
    let stop = loop {
        let rest = &data[position..];
        if rest.is_empty() {
            break ScanStop::End;
        }
        if rest.len() < record_batch::HEADER_BYTES {
            // Too short to tell: a torn header at the end of the file, or
            // the start of a whole batch cut by the end of a chunk the
            // caller read. Zeros prove nothing here: a base offset below
            // 2^24 begins with five zero bytes. Only the caller knows
            // whether more bytes follow.
            break ScanStop::Incomplete { position, needed_bytes: record_batch::HEADER_BYTES };
        }
        let header = match BatchHeader::parse(rest, batch_bytes_max) {
            Ok(header) => header,
            Err(_) => break ScanStop::Invalid { position },
        };
        if header.magic != 2 || header.base_offset != next_offset || header.last_offset_delta < 0 {
            break ScanStop::Invalid { position };
        }
        if header.size_bytes > rest.len() {
            break ScanStop::Incomplete { position, needed_bytes: header.size_bytes };
        }
        if record_batch::validate_framing(&rest[..header.size_bytes], batch_bytes_max).is_err() {
            break ScanStop::Invalid { position };
        }
        batches.push(ScannedBatch { position, header });
        next_offset = header.last_offset() + 1;
        position += header.size_bytes;
    };
    Scan { batches, next_offset, stop }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::record_batch::{encode_batch, patch, ProducerFields, Record};
    use bytes::Bytes;
    use proptest::prelude::*;

    /// A log image of `counts.len()` batches with dense offsets, and the end
    /// position of each batch.
    fn image(counts: &[usize]) -> (Vec<u8>, Vec<(usize, i64)>) {
        let mut out = Vec::new();
        let mut ends = Vec::new();
        let mut offset = 0i64;
        for (i, count) in counts.iter().enumerate() {
            let records: Vec<Record> = (0..*count)
                .map(|r| Record {
                    value: Some(Bytes::from(vec![i as u8; 20 + r])),
                    offset_delta: r as i32,
                    ..Record::default()
                })
                .collect();
            let mut batch = encode_batch(&records, 1_000, ProducerFields::NONE).to_vec();
            patch(&mut batch, offset, 0);
            offset += *count as i64;
            out.extend_from_slice(&batch);
            ends.push((out.len(), offset));
        }
        (out, ends)
    }

    #[test]
    fn clean_image_scans_to_the_end() {
        let (data, ends) = image(&[1, 5, 3]);
        let scan = scan(&data, 0, 1 << 20);
        assert_eq!(scan.stop, ScanStop::End);
        assert_eq!(scan.next_offset, 9);
        assert_eq!(scan.valid_bytes(), ends[2].0);
    }

    #[test]
    fn zeroed_preallocation_stops_the_scan() {
        let (mut data, ends) = image(&[2, 2]);
        data.extend_from_slice(&[0u8; 8192]);
        let scan = scan(&data, 0, 1 << 20);
        assert!(matches!(scan.stop, ScanStop::Invalid { .. }));
        assert_eq!(scan.valid_bytes(), ends[1].0);
    }

    #[test]
    fn a_slice_ending_in_the_zero_bytes_of_a_header_is_incomplete_not_invalid() {
        // A chunk boundary that falls 1..=5 bytes into a header leaves only
        // the high (zero) bytes of a small base offset in the slice.
        let (data, ends) = image(&[2, 3, 1]);
        for extra in 1..record_batch::HEADER_BYTES {
            let cut = ends[0].0 + extra;
            let scan = scan(&data[..cut], 0, 1 << 20);
            assert_eq!(
                scan.stop,
                ScanStop::Incomplete { position: ends[0].0, needed_bytes: record_batch::HEADER_BYTES },
                "{extra} bytes of the next header"
            );
            assert_eq!(scan.valid_bytes(), ends[0].0);
        }
    }

    #[test]
    fn offset_gap_is_invalid() {
        let (data, ends) = image(&[2, 2]);
        let scan = scan(&data, 1, 1 << 20);
        assert_eq!(scan.stop, ScanStop::Invalid { position: 0 });
        assert_eq!(ends.len(), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn recovered_prefix_matches_model_for_any_cut_and_garbage(
            counts in proptest::collection::vec(1usize..8, 1..20),
            cut_fraction in 0.0f64..1.0,
            garbage in proptest::collection::vec(any::<u8>(), 0..300),
            zeros in 0usize..5000,
            flip in proptest::option::of(0usize..100_000),
        ) {
            let (original, ends) = image(&counts);
            let cut = (original.len() as f64 * cut_fraction) as usize;
            let mut data = original[..cut].to_vec();
            if let Some(at) = flip {
                if !data.is_empty() {
                    let at = at % data.len();
                    data[at] ^= 0x40;
                }
            }
            data.extend_from_slice(&garbage);
            data.extend(std::iter::repeat_n(0u8, zeros));
            // The model: the longest run of batches whose bytes survived intact
            // (the leader epoch lies outside the CRC, so a change there is unseen).
            let mut model = (0, 0);
            let mut start = 0;
            for (end, next_offset) in &ends {
                let intact = data.len() >= *end
                    && data[start..start + 12] == original[start..start + 12]
                    && data[start + 16..*end] == original[start + 16..*end];
                if !intact {
                    break;
                }
                model = (*end, *next_offset);
                start = *end;
            }
            let scan = scan(&data, 0, 1 << 20);
            prop_assert_eq!((scan.valid_bytes(), scan.next_offset), model);
        }
    }
}
