//! What the load generator writes into each record, and how it picks
//! partitions. A value starts with a fixed header the consumer side reads
//! back; random (incompressible) filler makes up the rest:
//!
//! ```text
//! offset  size  field
//!      0     4  run id      (random per run: records of other runs are skipped)
//!      4     4  producer    (index of the producer client in this run)
//!      8     8  sequence    (per producer and partition, from 0)
//!     16     8  sent_us     (µs since the Unix epoch: the intended send time)
//!     24     …  filler
//! ```

use bytes::{BufMut, BytesMut};

pub const RUN_ID_AT: usize = 0;
pub const PRODUCER_AT: usize = RUN_ID_AT + 4;
pub const SEQUENCE_AT: usize = PRODUCER_AT + 4;
pub const SENT_US_AT: usize = SEQUENCE_AT + 8;
pub const HEADER_BYTES: usize = SENT_US_AT + 8;

const _: () = assert!(HEADER_BYTES == 24);

/// The header of one bench record value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueHeader {
    pub run_id: u32,
    pub producer: u32,
    pub sequence: u64,
    pub sent_us: u64,
}

impl ValueHeader {
    pub fn write(&self, out: &mut BytesMut) {
        out.put_u32(self.run_id);
        out.put_u32(self.producer);
        out.put_u64(self.sequence);
        out.put_u64(self.sent_us);
    }

    /// `None` when the value is too short to be ours.
    pub fn read(value: &[u8]) -> Option<Self> {
        if value.len() < HEADER_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_be_bytes(value[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_be_bytes(value[at..at + 8].try_into().expect("8 bytes"));
        Some(Self {
            run_id: u32_at(RUN_ID_AT),
            producer: u32_at(PRODUCER_AT),
            sequence: u64_at(SEQUENCE_AT),
            sent_us: u64_at(SENT_US_AT),
        })
    }
}

/// xorshift64*: fast, good enough for sizes, keys and filler, and seedable
/// so each producer has its own stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high);
        if low == high {
            return low;
        }
        low + self.next_u64() % (high - low + 1)
    }
}

/// A random run id, never 0.
pub fn run_id() -> u32 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    (Rng::new(nanos ^ (u64::from(std::process::id()) << 32)).next_u64() as u32).max(1)
}

/// Random bytes to cut filler from.
pub fn filler(bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(bytes + 8);
    while out.len() < bytes {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(bytes);
    out
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), so keyed
/// messages land on the partitions the Java client would pick.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The Java client's default partition for a key.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    assert!(partitions > 0);
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka_test_vectors() {
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), -58897971);
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn header_round_trips() {
        let header = ValueHeader { run_id: 7, producer: 3, sequence: 1 << 40, sent_us: 1_700_000_000_000_000 };
        let mut out = BytesMut::new();
        header.write(&mut out);
        out.put_slice(b"filler");
        assert_eq!(ValueHeader::read(&out), Some(header));
        assert_eq!(ValueHeader::read(&out[..HEADER_BYTES - 1]), None);
    }

    #[test]
    fn rng_stays_in_range() {
        let mut rng = Rng::new(1);
        for _ in 0..1000 {
            let v = rng.between(256, 4096);
            assert!((256..=4096).contains(&v));
        }
        assert_eq!(rng.between(5, 5), 5);
    }
}
