//! The store's wire format: every message is one frame, a little-endian `u32` byte count and
//! then the body; a body is a one-byte tag and its fields (integers little-endian, byte strings
//! as a `u32` count and the bytes).
//!
//! A connection opens with [`Request::Hello`] (magic, protocol version, job token); the server
//! answers [`Response::Welcome`] or [`Response::Refused`] and closes. After that it is strictly
//! one request, one response.

use std::io::{self, Read, Write};

/// "FXST": tells a store connection from a stray one.
pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"FXST");
/// Bumped on any change to the frames below.
pub(crate) const VERSION: u32 = 1;
/// Largest hello frame: nothing unauthenticated may make the server allocate more.
pub(crate) const MAX_HELLO: u32 = 64 * 1024;
/// Largest frame after the handshake.
pub(crate) const MAX_FRAME: u32 = 1 << 30;

/// Client → server.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Hello {
        magic: u32,
        version: u32,
        token: Vec<u8>,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    /// Waits up to `wait_ms` for the key to exist.
    Get {
        key: String,
        wait_ms: u64,
    },
    Add {
        key: String,
        delta: i64,
    },
    Delete {
        key: String,
    },
    Check {
        keys: Vec<String>,
    },
}

/// Server → client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Response {
    Welcome,
    Refused(String),
    Done,
    Value(Vec<u8>),
    /// `get`'s wait ended without the key.
    Missing,
    Int(i64),
    Bool(bool),
    Error(String),
}

mod tag {
    pub const HELLO: u8 = 1;
    pub const SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const DELETE: u8 = 5;
    pub const CHECK: u8 = 6;

    pub const WELCOME: u8 = 101;
    pub const REFUSED: u8 = 102;
    pub const DONE: u8 = 103;
    pub const VALUE: u8 = 104;
    pub const MISSING: u8 = 105;
    pub const INT: u8 = 106;
    pub const BOOL: u8 = 107;
    pub const ERROR: u8 = 108;
}

impl Request {
    pub(crate) fn encode(&self) -> io::Result<Vec<u8>> {
        let mut b = Body::default();
        match self {
            Request::Hello {
                magic,
                version,
                token,
            } => {
                b.u8(tag::HELLO);
                b.u32(*magic);
                b.u32(*version);
                b.bytes(token)?;
            }
            Request::Set { key, value } => {
                b.u8(tag::SET);
                b.bytes(key.as_bytes())?;
                b.bytes(value)?;
            }
            Request::Get { key, wait_ms } => {
                b.u8(tag::GET);
                b.bytes(key.as_bytes())?;
                b.u64(*wait_ms);
            }
            Request::Add { key, delta } => {
                b.u8(tag::ADD);
                b.bytes(key.as_bytes())?;
                b.u64(*delta as u64);
            }
            Request::Delete { key } => {
                b.u8(tag::DELETE);
                b.bytes(key.as_bytes())?;
            }
            Request::Check { keys } => {
                b.u8(tag::CHECK);
                b.u32(count(keys.len())?);
                for k in keys {
                    b.bytes(k.as_bytes())?;
                }
            }
        }
        Ok(b.0)
    }

    pub(crate) fn decode(body: &[u8]) -> io::Result<Request> {
        let mut c = Cursor(body);
        let req = match c.u8()? {
            tag::HELLO => Request::Hello {
                magic: c.u32()?,
                version: c.u32()?,
                token: c.bytes()?.to_vec(),
            },
            tag::SET => Request::Set {
                key: c.string()?,
                value: c.bytes()?.to_vec(),
            },
            tag::GET => Request::Get {
                key: c.string()?,
                wait_ms: c.u64()?,
            },
            tag::ADD => Request::Add {
                key: c.string()?,
                delta: c.u64()? as i64,
            },
            tag::DELETE => Request::Delete { key: c.string()? },
            tag::CHECK => {
                let n = c.u32()? as usize;
                // Each key takes at least its 4-byte count: bounds the allocation by the frame.
                let mut keys = Vec::with_capacity(n.min(c.0.len() / 4));
                for _ in 0..n {
                    keys.push(c.string()?);
                }
                Request::Check { keys }
            }
            t => return Err(invalid(format!("unknown request tag {t}"))),
        };
        c.finish()?;
        Ok(req)
    }
}

impl Response {
    pub(crate) fn encode(&self) -> io::Result<Vec<u8>> {
        let mut b = Body::default();
        match self {
            Response::Welcome => b.u8(tag::WELCOME),
            Response::Refused(m) => {
                b.u8(tag::REFUSED);
                b.bytes(m.as_bytes())?;
            }
            Response::Done => b.u8(tag::DONE),
            Response::Value(v) => {
                b.u8(tag::VALUE);
                b.bytes(v)?;
            }
            Response::Missing => b.u8(tag::MISSING),
            Response::Int(i) => {
                b.u8(tag::INT);
                b.u64(*i as u64);
            }
            Response::Bool(v) => {
                b.u8(tag::BOOL);
                b.u8(u8::from(*v));
            }
            Response::Error(m) => {
                b.u8(tag::ERROR);
                b.bytes(m.as_bytes())?;
            }
        }
        Ok(b.0)
    }

    pub(crate) fn decode(body: &[u8]) -> io::Result<Response> {
        let mut c = Cursor(body);
        let resp = match c.u8()? {
            tag::WELCOME => Response::Welcome,
            tag::REFUSED => Response::Refused(c.string()?),
            tag::DONE => Response::Done,
            tag::VALUE => Response::Value(c.bytes()?.to_vec()),
            tag::MISSING => Response::Missing,
            tag::INT => Response::Int(c.u64()? as i64),
            tag::BOOL => match c.u8()? {
                0 => Response::Bool(false),
                1 => Response::Bool(true),
                v => return Err(invalid(format!("bad boolean {v}"))),
            },
            tag::ERROR => Response::Error(c.string()?),
            t => return Err(invalid(format!("unknown response tag {t}"))),
        };
        c.finish()?;
        Ok(resp)
    }
}

/// Writes `body` as one frame, in one write so a frame is never split by Nagle's algorithm.
pub(crate) fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "message of {} bytes is over the store's limit of {MAX_FRAME} bytes",
                    body.len()
                ),
            )
        })?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(body);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame of at most `max` bytes. `Ok(None)` is a clean end of stream before a frame.
pub(crate) fn read_frame(r: &mut impl Read, max: u32) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len);
    if len > max {
        return Err(invalid(format!(
            "frame of {len} bytes is over the limit of {max}"
        )));
    }
    // Grows with the data received, so a peer cannot make us allocate what it never sends.
    let mut body = Vec::new();
    r.take(u64::from(len)).read_to_end(&mut body)?;
    if body.len() != len as usize {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(body))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn count(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{n} is over the store's limit of {} bytes", u32::MAX),
        )
    })
}

#[derive(Default)]
struct Body(Vec<u8>);

impl Body {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) -> io::Result<()> {
        self.u32(count(v.len())?);
        self.0.extend_from_slice(v);
        Ok(())
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(invalid("truncated message".to_owned()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| invalid("a key is not UTF-8".to_owned()))
    }
    fn finish(&self) -> io::Result<()> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(invalid(format!(
                "{} unexpected bytes after the message",
                self.0.len()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_survive_a_round_trip() {
        let reqs = [
            Request::Hello {
                magic: MAGIC,
                version: VERSION,
                token: b"t0k".to_vec(),
            },
            Request::Set {
                key: "k".into(),
                value: vec![0, 255, 7],
            },
            Request::Get {
                key: "é".into(),
                wait_ms: 1234,
            },
            Request::Add {
                key: "c".into(),
                delta: -5,
            },
            Request::Delete { key: "".into() },
            Request::Check {
                keys: vec!["a".into(), "b".into()],
            },
        ];
        for r in reqs {
            let mut buf = Vec::new();
            write_frame(&mut buf, &r.encode().unwrap()).unwrap();
            let body = read_frame(&mut buf.as_slice(), MAX_FRAME).unwrap().unwrap();
            assert_eq!(Request::decode(&body).unwrap(), r);
        }
        let resps = [
            Response::Welcome,
            Response::Refused("no".into()),
            Response::Done,
            Response::Value(vec![1, 2]),
            Response::Missing,
            Response::Int(-9),
            Response::Bool(true),
            Response::Error("bad".into()),
        ];
        for r in resps {
            assert_eq!(Response::decode(&r.encode().unwrap()).unwrap(), r);
        }
    }

    #[test]
    fn oversized_truncated_and_trailing_frames_are_rejected() {
        let mut big = Vec::new();
        big.extend_from_slice(&(MAX_HELLO + 1).to_le_bytes());
        let e = read_frame(&mut big.as_slice(), MAX_HELLO).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);

        let mut short = Vec::new();
        short.extend_from_slice(&10u32.to_le_bytes());
        short.extend_from_slice(&[1, 2, 3]);
        let e = read_frame(&mut short.as_slice(), MAX_FRAME).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);

        assert!(read_frame(&mut [].as_slice(), MAX_FRAME).unwrap().is_none());

        let mut body = Request::Delete { key: "k".into() }.encode().unwrap();
        body.push(0);
        assert!(Request::decode(&body).is_err());
        assert!(Request::decode(&[99]).is_err());
        // A check claiming 4 billion keys in a tiny frame fails without allocating them.
        let mut lie = vec![tag::CHECK];
        lie.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Request::decode(&lie).is_err());
    }
}
