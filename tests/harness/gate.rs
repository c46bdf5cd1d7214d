//! A provider's front door in the harness: forwards a loopback port to the provider (the
//! sandbox, or the SMTP sink), can go down — stop listening (new connections are refused) and
//! cut the connections open — and come back on the same port, and notes every identity the
//! workers' requests carried on their way in (the `Idempotency-Key` of an HTTP call, the
//! `RCPT TO` of an SMTP transaction), whether or not the provider went on to apply it. A claim
//! parked for a person whose identity never passed the gate was parked without ever being
//! sent.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Gate {
    pub port: u16,
    target: SocketAddr,
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
    cut: tokio::sync::watch::Sender<u64>,
    seen: Arc<Mutex<HashSet<String>>>,
}

/// Header lines (lower case, with the colon) whose value the gate records.
const NOTED: [&str; 2] = ["idempotency-key:", "rcpt to:"];

impl Gate {
    pub async fn start(target: SocketAddr) -> Arc<Gate> {
        Self::start_noting(target, Arc::new(Mutex::new(HashSet::new()))).await
    }

    /// Another door, to `target`, that notes into `beside`'s record (one record of the keys
    /// seen for every door of one provider).
    pub async fn start_beside(target: SocketAddr, beside: &Gate) -> Arc<Gate> {
        Self::start_noting(target, beside.seen.clone()).await
    }

    async fn start_noting(target: SocketAddr, seen: Arc<Mutex<HashSet<String>>>) -> Arc<Gate> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gate = Arc::new(Gate {
            port: listener.local_addr().unwrap().port(),
            target,
            accept: Mutex::new(None),
            cut: tokio::sync::watch::channel(0u64).0,
            seen,
        });
        gate.serve(listener);
        gate
    }

    /// Every key (HTTP) or recipient (SMTP, without the angle brackets) that passed.
    pub fn seen(&self) -> HashSet<String> {
        self.seen.lock().unwrap().clone()
    }

    fn serve(&self, listener: TcpListener) {
        let (target, cut, seen) = (self.target, self.cut.clone(), self.seen.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let mut cut_rx = cut.subscribe();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut in_r, mut in_w) = inbound.into_split();
                    let (mut out_r, mut out_w) = outbound.into_split();
                    let upstream = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        let mut line = Vec::new();
                        loop {
                            let n = match in_r.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            note(&buf[..n], &mut line, &seen);
                            if out_w.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = out_w.shutdown().await;
                    };
                    let downstream = async {
                        let _ = tokio::io::copy(&mut out_r, &mut in_w).await;
                        let _ = in_w.shutdown().await;
                    };
                    tokio::select! {
                        _ = async { tokio::join!(upstream, downstream) } => {}
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        *self.accept.lock().unwrap() = Some(task);
    }

    /// Down for `d`, then up again on the same port.
    pub async fn outage(&self, d: Duration) {
        if let Some(task) = self.accept.lock().unwrap().take() {
            task.abort(); // drops the listener: connections are refused
        }
        self.cut.send_modify(|n| *n += 1);
        tokio::time::sleep(d).await;
        for _ in 0..100 {
            if let Ok(l) = TcpListener::bind(("127.0.0.1", self.port)).await {
                self.serve(l);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the provider's port {} could not be bound again", self.port);
    }
}

/// Scans the bytes on their way to the provider line by line (`line` carries a line cut across
/// reads) and records the values of the [`NOTED`] lines.
fn note(chunk: &[u8], line: &mut Vec<u8>, seen: &Mutex<HashSet<String>>) {
    for &b in chunk {
        if b == b'\n' {
            let text = String::from_utf8_lossy(line);
            let lower = text.to_ascii_lowercase();
            for prefix in NOTED {
                if let Some(rest) = lower.strip_prefix(prefix) {
                    let start = text.len() - rest.len();
                    let value = text[start..].trim();
                    // `RCPT TO:<a@b> PARAMS`: the address inside the brackets.
                    let value = match (value.find('<'), value.find('>')) {
                        (Some(a), Some(b)) if a < b => &value[a + 1..b],
                        _ => value,
                    }
                    .to_string();
                    seen.lock().unwrap().insert(value);
                }
            }
            line.clear();
        } else if line.len() < 1024 {
            line.push(b);
        }
    }
}
