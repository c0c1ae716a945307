//! Kafka wire primitives: a bounds-checked reader over a received frame and a
//! writer that builds a response out of owned chunks.
//!
//! Every length read off the wire is checked against the bytes that remain
//! before anything is allocated or sliced: an array that claims more elements
//! than the frame could possibly hold is refused up front, so a hostile client
//! cannot make the broker reserve memory it never sent.

use bytes::{BufMut, Bytes, BytesMut};

/// Why a frame could not be decoded. Each variant ends the request with an
/// error (or the connection when the header itself is unreadable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("frame ended early: needed {needed} bytes, {remaining} remain")]
    Truncated { needed: usize, remaining: usize },
    #[error("negative length {0} where null is not allowed")]
    NegativeLength(i64),
    #[error("array of {count} elements cannot fit in {remaining} remaining bytes")]
    ArrayTooLong { count: i64, remaining: usize },
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    #[error("varint is longer than its type allows")]
    VarintOverflow,
    #[error("unsupported version {version} of api {api_key}")]
    UnsupportedVersion { api_key: i16, version: i16 },
    #[error("unknown api key {0}")]
    UnknownApiKey(i16),
    #[error("invalid value: {0}")]
    Invalid(&'static str),
}

pub type DecodeResult<T> = Result<T, DecodeError>;

/// A cursor over one received frame. Slices it hands out share the frame's
/// memory, so record batches are never copied while decoding; record sets
/// come out uniquely owned (`BytesMut`), so the log can patch offsets into
/// them in place.
#[derive(Debug)]
pub struct Reader {
    /// What has not been handed out as a slice yet; reading resumes at `pos`.
    buf: BytesMut,
    pos: usize,
}

impl Reader {
    /// A reader over a shared buffer: copies it when other references to it
    /// are alive, so slices it hands out can be owned uniquely.
    pub fn new(buf: Bytes) -> Self {
        Self::from_frame(BytesMut::from(buf))
    }

    pub fn from_frame(buf: BytesMut) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, len: usize) -> DecodeResult<&[u8]> {
        if len > self.remaining() {
            return Err(DecodeError::Truncated { needed: len, remaining: self.remaining() });
        }
        let start = self.pos;
        self.pos += len;
        Ok(&self.buf[start..start + len])
    }

    pub fn take_bytes(&mut self, len: usize) -> DecodeResult<Bytes> {
        self.take_bytes_mut(len).map(BytesMut::freeze)
    }

    /// The next `len` bytes as a buffer of their own (no copy).
    pub fn take_bytes_mut(&mut self, len: usize) -> DecodeResult<BytesMut> {
        if len > self.remaining() {
            return Err(DecodeError::Truncated { needed: len, remaining: self.remaining() });
        }
        bytes::Buf::advance(&mut self.buf, self.pos);
        self.pos = 0;
        Ok(self.buf.split_to(len))
    }

    pub fn i8(&mut self) -> DecodeResult<i8> {
        Ok(self.take(1)?[0] as i8)
    }

    pub fn bool(&mut self) -> DecodeResult<bool> {
        Ok(self.i8()? != 0)
    }

    pub fn i16(&mut self) -> DecodeResult<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self) -> DecodeResult<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u32(&mut self) -> DecodeResult<u32> {
        Ok(self.i32()? as u32)
    }

    pub fn i64(&mut self) -> DecodeResult<i64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    pub fn uuid(&mut self) -> DecodeResult<[u8; 16]> {
        let b = self.take(16)?;
        let mut a = [0u8; 16];
        a.copy_from_slice(b);
        Ok(a)
    }

    /// Unsigned LEB128 varint, at most 5 bytes.
    pub fn uvarint(&mut self) -> DecodeResult<u32> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::VarintOverflow)
    }

    /// Zig-zag signed varint (records use these).
    pub fn varint(&mut self) -> DecodeResult<i32> {
        let raw = self.uvarint()?;
        Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
    }

    pub fn varlong(&mut self) -> DecodeResult<i64> {
        let mut value: u64 = 0;
        for shift in (0..70).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        Err(DecodeError::VarintOverflow)
    }

    fn utf8(&mut self, len: usize) -> DecodeResult<String> {
        let raw = self.take(len)?;
        std::str::from_utf8(raw).map(str::to_owned).map_err(|_| DecodeError::InvalidUtf8)
    }

    pub fn string(&mut self) -> DecodeResult<String> {
        self.nullable_string()?.ok_or(DecodeError::NegativeLength(-1))
    }

    pub fn nullable_string(&mut self) -> DecodeResult<Option<String>> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        self.utf8(len as usize).map(Some)
    }

    pub fn compact_string(&mut self) -> DecodeResult<String> {
        self.compact_nullable_string()?.ok_or(DecodeError::NegativeLength(-1))
    }

    pub fn compact_nullable_string(&mut self) -> DecodeResult<Option<String>> {
        let len_plus_one = self.uvarint()?;
        if len_plus_one == 0 {
            return Ok(None);
        }
        self.utf8(len_plus_one as usize - 1).map(Some)
    }

    /// String in the flexible or the classic encoding.
    pub fn string_v(&mut self, flexible: bool) -> DecodeResult<String> {
        if flexible {
            self.compact_string()
        } else {
            self.string()
        }
    }

    pub fn nullable_string_v(&mut self, flexible: bool) -> DecodeResult<Option<String>> {
        if flexible {
            self.compact_nullable_string()
        } else {
            self.nullable_string()
        }
    }

    pub fn nullable_bytes(&mut self) -> DecodeResult<Option<Bytes>> {
        Ok(self.nullable_bytes_mut()?.map(BytesMut::freeze))
    }

    /// Nullable bytes (classic encoding) as a buffer of their own.
    pub fn nullable_bytes_mut(&mut self) -> DecodeResult<Option<BytesMut>> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        self.take_bytes_mut(len as usize).map(Some)
    }

    pub fn bytes(&mut self) -> DecodeResult<Bytes> {
        self.nullable_bytes()?.ok_or(DecodeError::NegativeLength(-1))
    }

    pub fn compact_nullable_bytes(&mut self) -> DecodeResult<Option<Bytes>> {
        let len_plus_one = self.uvarint()?;
        if len_plus_one == 0 {
            return Ok(None);
        }
        self.take_bytes(len_plus_one as usize - 1).map(Some)
    }

    pub fn bytes_v(&mut self, flexible: bool) -> DecodeResult<Bytes> {
        if flexible {
            self.compact_nullable_bytes()?.ok_or(DecodeError::NegativeLength(-1))
        } else {
            self.bytes()
        }
    }

    pub fn nullable_bytes_v(&mut self, flexible: bool) -> DecodeResult<Option<Bytes>> {
        if flexible {
            self.compact_nullable_bytes()
        } else {
            self.nullable_bytes()
        }
    }

    /// Element count of an array whose elements take at least `element_bytes_min`
    /// bytes each; null arrays read as empty. The count is refused when the
    /// elements could not fit in what remains of the frame.
    pub fn array_len(&mut self, element_bytes_min: usize) -> DecodeResult<usize> {
        let count = self.i32()?;
        self.check_count(i64::from(count), element_bytes_min)
    }

    /// Length of a nullable array: `None` for null (a negative count),
    /// otherwise the count, checked like `array_len`.
    pub fn nullable_array_len(&mut self, element_bytes_min: usize) -> DecodeResult<Option<usize>> {
        let count = self.i32()?;
        if count < 0 {
            return Ok(None);
        }
        self.check_count(i64::from(count), element_bytes_min).map(Some)
    }

    pub fn compact_array_len(&mut self, element_bytes_min: usize) -> DecodeResult<usize> {
        let count = i64::from(self.uvarint()?) - 1;
        self.check_count(count, element_bytes_min)
    }

    pub fn array_len_v(&mut self, flexible: bool, element_bytes_min: usize) -> DecodeResult<usize> {
        if flexible {
            self.compact_array_len(element_bytes_min)
        } else {
            self.array_len(element_bytes_min)
        }
    }

    /// A nullable array's length in the flexible or the classic encoding.
    pub fn nullable_array_len_v(&mut self, flexible: bool, element_bytes_min: usize) -> DecodeResult<Option<usize>> {
        if !flexible {
            return self.nullable_array_len(element_bytes_min);
        }
        let len_plus_one = self.uvarint()?;
        if len_plus_one == 0 {
            return Ok(None);
        }
        self.check_count(i64::from(len_plus_one) - 1, element_bytes_min).map(Some)
    }

    fn check_count(&self, count: i64, element_bytes_min: usize) -> DecodeResult<usize> {
        if count < 0 {
            return Ok(0);
        }
        let needed = (count as u64).saturating_mul(element_bytes_min.max(1) as u64);
        if needed > self.remaining() as u64 {
            return Err(DecodeError::ArrayTooLong { count, remaining: self.remaining() });
        }
        Ok(count as usize)
    }

    /// Skips a tagged-field section (flexible versions); we know no tags.
    pub fn tagged_fields(&mut self) -> DecodeResult<()> {
        let count = self.uvarint()?;
        self.check_count(i64::from(count), 2)?;
        for _ in 0..count {
            let _tag = self.uvarint()?;
            let len = self.uvarint()? as usize;
            self.take(len)?;
        }
        Ok(())
    }

    pub fn tagged_fields_v(&mut self, flexible: bool) -> DecodeResult<()> {
        if flexible {
            self.tagged_fields()
        } else {
            Ok(())
        }
    }
}

/// Builds an encoded message out of a growing buffer plus shared chunks, so
/// that record batches from the log go out without being copied.
#[derive(Debug, Default)]
pub struct Writer {
    chunks: Vec<Bytes>,
    current: BytesMut,
}

/// Chunks shorter than this are copied into the buffer instead of being sent
/// as their own piece: one more small memcpy beats one more write.
const SHARED_CHUNK_BYTES_MIN: usize = 4096;

impl Writer {
    pub fn new() -> Self {
        Self { chunks: Vec::new(), current: BytesMut::with_capacity(256) }
    }

    pub fn len(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum::<usize>() + self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn i8(&mut self, v: i8) {
        self.current.put_i8(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.current.put_i8(v as i8);
    }
    pub fn i16(&mut self, v: i16) {
        self.current.put_i16(v);
    }
    pub fn i32(&mut self, v: i32) {
        self.current.put_i32(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.current.put_u32(v);
    }
    pub fn i64(&mut self, v: i64) {
        self.current.put_i64(v);
    }
    pub fn uuid(&mut self, v: &[u8; 16]) {
        self.current.put_slice(v);
    }

    pub fn uvarint(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.current.put_u8((v as u8) | 0x80);
            v >>= 7;
        }
        self.current.put_u8(v as u8);
    }

    pub fn varint(&mut self, v: i32) {
        self.uvarint(((v << 1) ^ (v >> 31)) as u32);
    }

    pub fn varlong(&mut self, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            self.current.put_u8((z as u8) | 0x80);
            z >>= 7;
        }
        self.current.put_u8(z as u8);
    }

    pub fn raw(&mut self, data: &[u8]) {
        self.current.put_slice(data);
    }

    pub fn string(&mut self, s: &str) {
        self.i16(s.len() as i16);
        self.raw(s.as_bytes());
    }

    pub fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.i16(-1),
        }
    }

    pub fn compact_nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.uvarint(s.len() as u32 + 1);
                self.raw(s.as_bytes());
            }
            None => self.uvarint(0),
        }
    }

    pub fn string_v(&mut self, s: &str, flexible: bool) {
        if flexible {
            self.compact_nullable_string(Some(s));
        } else {
            self.string(s);
        }
    }

    pub fn nullable_string_v(&mut self, s: Option<&str>, flexible: bool) {
        if flexible {
            self.compact_nullable_string(s);
        } else {
            self.nullable_string(s);
        }
    }

    pub fn nullable_bytes_v(&mut self, b: Option<&[u8]>, flexible: bool) {
        match (b, flexible) {
            (Some(b), false) => {
                self.i32(b.len() as i32);
                self.raw(b);
            }
            (Some(b), true) => {
                self.uvarint(b.len() as u32 + 1);
                self.raw(b);
            }
            (None, false) => self.i32(-1),
            (None, true) => self.uvarint(0),
        }
    }

    pub fn bytes_v(&mut self, b: &[u8], flexible: bool) {
        self.nullable_bytes_v(Some(b), flexible);
    }

    pub fn array_len_v(&mut self, len: usize, flexible: bool) {
        if flexible {
            self.uvarint(len as u32 + 1);
        } else {
            self.i32(len as i32);
        }
    }

    /// A nullable array's length: `None` writes null.
    pub fn nullable_array_len_v(&mut self, len: Option<usize>, flexible: bool) {
        match (len, flexible) {
            (Some(len), _) => self.array_len_v(len, flexible),
            (None, true) => self.uvarint(0),
            (None, false) => self.i32(-1),
        }
    }

    /// An empty tagged-field section, written only in flexible versions.
    pub fn tagged_fields_v(&mut self, flexible: bool) {
        if flexible {
            self.uvarint(0);
        }
    }

    /// Appends shared bytes (record batches) without copying large ones.
    pub fn shared(&mut self, data: Bytes) {
        if data.len() < SHARED_CHUNK_BYTES_MIN {
            self.current.put_slice(&data);
            return;
        }
        if !self.current.is_empty() {
            self.chunks.push(self.current.split().freeze());
        }
        self.chunks.push(data);
    }

    /// The encoded message as a list of chunks, in order.
    pub fn into_chunks(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.chunks.push(self.current.freeze());
        }
        self.chunks
    }

    /// The encoded message as one contiguous buffer (tests, small messages).
    pub fn into_bytes(self) -> Bytes {
        let chunks = self.into_chunks();
        if chunks.len() == 1 {
            return chunks.into_iter().next().unwrap_or_default();
        }
        let mut out = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
        for chunk in chunks {
            out.put_slice(&chunk);
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_claiming_more_elements_than_bytes_is_refused() {
        let mut w = Writer::new();
        w.i32(i32::MAX);
        let mut r = Reader::new(w.into_bytes());
        assert!(matches!(r.array_len(4), Err(DecodeError::ArrayTooLong { .. })));
    }

    #[test]
    fn byte_fields_are_slices_of_the_frame_owned_apart_from_each_other() {
        let mut frame = BytesMut::new();
        frame.put_i32(3);
        frame.put_slice(b"abc");
        frame.put_i32(2);
        frame.put_slice(b"de");
        frame.put_i16(7);
        let start = frame.as_ptr() as usize;
        let mut r = Reader::from_frame(frame);
        let mut first = r.nullable_bytes_mut().unwrap().unwrap();
        assert_eq!(first.as_ptr() as usize, start + 4, "not copied out of the frame");
        first.copy_from_slice(b"xyz");
        let second = r.nullable_bytes().unwrap().unwrap();
        assert_eq!(second.as_ptr() as usize, start + 11);
        assert_eq!(&second[..], b"de", "writing one slice leaves the next alone");
        assert_eq!(r.i16().unwrap(), 7);
        assert_eq!(r.remaining(), 0);
        assert!(matches!(r.take_bytes_mut(1), Err(DecodeError::Truncated { needed: 1, remaining: 0 })));
    }

    #[test]
    fn a_null_array_reads_as_none_and_a_count_beyond_the_frame_is_refused() {
        let mut w = Writer::new();
        w.i32(-1);
        w.i32(1_000);
        let mut r = Reader::new(w.into_bytes());
        assert_eq!(r.nullable_array_len(4), Ok(None));
        assert!(matches!(r.nullable_array_len(4), Err(DecodeError::ArrayTooLong { count: 1_000, .. })));
    }

    #[test]
    fn varints_round_trip() {
        for v in [0i32, 1, -1, 63, -64, 300, i32::MAX, i32::MIN] {
            let mut w = Writer::new();
            w.varint(v);
            assert_eq!(Reader::new(w.into_bytes()).varint().unwrap(), v);
        }
        for v in [0i64, -1, 1 << 40, i64::MIN, i64::MAX] {
            let mut w = Writer::new();
            w.varlong(v);
            assert_eq!(Reader::new(w.into_bytes()).varlong().unwrap(), v);
        }
    }

    #[test]
    fn truncated_string_is_an_error_not_a_panic() {
        let mut w = Writer::new();
        w.i16(100);
        w.raw(b"abc");
        let mut r = Reader::new(w.into_bytes());
        assert!(matches!(r.string(), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn large_shared_chunks_are_not_copied() {
        let big = Bytes::from(vec![7u8; 10_000]);
        let mut w = Writer::new();
        w.i32(1);
        w.shared(big.clone());
        let chunks = w.into_chunks();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[1].as_ptr(), big.as_ptr());
    }
}
