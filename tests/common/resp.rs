//! A minimal raw RESP2/RESP3 client for robustness tests: arguments are raw bytes, error
//! replies are values (not `Err`), and large batches can be pipelined without any per-command
//! round trip. `common::resp`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis::Value;

use super::reply::{CellReply, LimiterReply, MultiReply, RlInfo};

#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Status(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    /// Bulk string; `None` is the RESP2 null bulk / RESP3 null.
    Bulk(Option<Vec<u8>>),
    /// Array (RESP3 sets and pushes too); `None` is the RESP2 null array.
    Array(Option<Vec<Reply>>),
    /// RESP3 map, as (key, value) pairs.
    Map(Vec<(Reply, Reply)>),
    Double(Vec<u8>),
    Bool(bool),
    Null,
}

impl Reply {
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
    pub fn error_text(&self) -> Option<String> {
        match self {
            Reply::Error(e) => Some(String::from_utf8_lossy(e).into_owned()),
            _ => None,
        }
    }
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn bulk(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Status(b) => Some(b),
            _ => None,
        }
    }
    pub fn array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(a)) => Some(a),
            _ => None,
        }
    }
    /// Integers of an all-integer array (a limiter reply), else None.
    pub fn ints(&self) -> Option<Vec<i64>> {
        self.array()?.iter().map(|r| r.int()).collect()
    }
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None) | Reply::Null)
    }
    pub fn text(&self) -> String {
        format!("{self:?}")
    }
    /// The same reply as the `redis` crate's value, for the decoders of `common::reply`
    /// (panics on an error reply).
    pub fn value(&self) -> Value {
        match self {
            Reply::Status(s) => Value::SimpleString(String::from_utf8_lossy(s).into_owned()),
            Reply::Error(e) => panic!("error reply: {}", String::from_utf8_lossy(e)),
            Reply::Int(i) => Value::Int(*i),
            Reply::Bulk(Some(b)) => Value::BulkString(b.clone()),
            Reply::Bulk(None) | Reply::Array(None) | Reply::Null => Value::Nil,
            Reply::Array(Some(a)) => Value::Array(a.iter().map(Reply::value).collect()),
            Reply::Map(m) => Value::Map(m.iter().map(|(k, v)| (k.value(), v.value())).collect()),
            Reply::Double(d) => Value::Double(String::from_utf8_lossy(d).parse().unwrap_or(f64::NAN)),
            Reply::Bool(b) => Value::Boolean(*b),
        }
    }

    /// A limiter reply, decoded by field name; panics on anything else.
    pub fn limiter(&self) -> LimiterReply {
        LimiterReply::of(&self.value())
    }

    /// CL.THROTTLE's reply; panics on anything else.
    pub fn cell(&self) -> CellReply {
        CellReply::of(&self.value())
    }

    /// RL.MULTI's reply; panics on anything else.
    pub fn multi(&self) -> MultiReply {
        MultiReply::of(&self.value())
    }

    /// RL.INFO's reply (None for nil); panics on anything else.
    pub fn rl_info(&self) -> Option<RlInfo> {
        RlInfo::of(&self.value())
    }

    /// One field of a field/value reply (RL.INFO's), by name.
    pub fn field(&self, name: &str) -> Option<Reply> {
        self.pairs()?.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// A RL.INFO field/value flat array as (name, value) pairs.
    pub fn pairs(&self) -> Option<Vec<(String, Reply)>> {
        match self {
            Reply::Array(Some(a)) if a.len() % 2 == 0 => {
                a.chunks(2).map(|kv| Some((String::from_utf8(kv[0].bulk()?.to_vec()).ok()?, kv[1].clone()))).collect()
            }
            Reply::Map(m) => {
                m.iter().map(|(k, v)| Some((String::from_utf8(k.bulk()?.to_vec()).ok()?, v.clone()))).collect()
            }
            _ => None,
        }
    }
}

/// Appends one command in RESP (array of bulk strings) to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

pub fn encode_owned(out: &mut Vec<u8>, args: &[Vec<u8>]) {
    let v: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    encode(out, &v);
}

pub struct Resp {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Resp {
    pub fn connect(port: u16) -> Resp {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect to {port}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_nodelay(true).unwrap();
        let w = s.try_clone().unwrap();
        Resp { reader: BufReader::with_capacity(1 << 16, s), writer: w }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        let mut l = Vec::new();
        self.reader.read_until(b'\n', &mut l)?;
        if l.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        if !l.ends_with(b"\r\n") {
            return Err(bad(format!("bad line {:?}", String::from_utf8_lossy(&l))));
        }
        l.truncate(l.len() - 2);
        Ok(l)
    }

    fn num(l: &[u8]) -> io::Result<i64> {
        std::str::from_utf8(l)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad number {:?}", String::from_utf8_lossy(l))))
    }

    pub fn read(&mut self) -> io::Result<Reply> {
        let l = self.line()?;
        let (t, rest) = (l[0], &l[1..]);
        Ok(match t {
            b'+' => Reply::Status(rest.to_vec()),
            b'-' => Reply::Error(rest.to_vec()),
            b':' => Reply::Int(Self::num(rest)?),
            b'$' | b'=' => {
                let n = Self::num(rest)?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.reader.read_exact(&mut buf)?;
                    buf.truncate(n as usize);
                    Reply::Bulk(Some(buf))
                }
            }
            b'*' | b'~' | b'>' => {
                let n = Self::num(rest)?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut v = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        v.push(self.read()?);
                    }
                    Reply::Array(Some(v))
                }
            }
            b'%' | b'|' => {
                let n = Self::num(rest)?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let k = self.read()?;
                    let val = self.read()?;
                    v.push((k, val));
                }
                if t == b'|' {
                    // An attribute precedes the real reply.
                    return self.read();
                }
                Reply::Map(v)
            }
            b'_' => Reply::Null,
            b'#' => Reply::Bool(rest == b"t"),
            b',' | b'(' => Reply::Double(rest.to_vec()),
            _ => return Err(bad(format!("unknown RESP type {:?}", l))),
        })
    }

    /// One command, one reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> Reply {
        let mut out = Vec::new();
        encode(&mut out, args);
        self.send_raw(&out).expect("send");
        self.read().expect("read reply")
    }

    /// `cmd` with string arguments.
    pub fn c(&mut self, args: &[&str]) -> Reply {
        let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd(&v)
    }

    /// Sets the module's debug clock (µs since the epoch), asserting `+OK`.
    pub fn clock_set(&mut self, us: i64) {
        assert_eq!(
            self.c(&["RL.DEBUG", "CLOCK", "SET", &us.to_string()]),
            Reply::Status(b"OK".to_vec()),
            "RL.DEBUG CLOCK SET"
        );
    }

    /// Sends all commands at once, then reads one reply per command.
    pub fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> io::Result<Vec<Reply>> {
        let mut out = Vec::with_capacity(cmds.len() * 48);
        for c in cmds {
            encode_owned(&mut out, c);
        }
        self.send_raw(&out)?;
        (0..cmds.len()).map(|_| self.read()).collect()
    }
}

/// Builds an owned argument vector from string-ish pieces.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$(AsRef::<[u8]>::as_ref(&$a).to_vec()),*] };
}
