//! A real SMTP server on loopback for tests (not a mock of lettre): speaks enough SMTP for a
//! client (220 greeting, EHLO/HELO, MAIL FROM, RCPT TO, DATA, the final `.`, RSET, NOOP, QUIT),
//! records every message it was sent with its Message-ID, and can be told to misbehave for the
//! next transactions: answer 4xx/5xx, close the connection after the content without answering,
//! or wait before its `250` so the client times out between DATA and settle.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How the sink answers one mail transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// `250` after the content: accepted.
    Accept,
    /// Answer this code to `RCPT TO` (the content is never sent).
    RcptReply(u16),
    /// Read the content, then answer this code instead of `250` (not accepted).
    DataReply(u16),
    /// Read the content, record it, and close the connection without answering.
    DropAfterData,
    /// Read the content, record it, wait this long, then answer `250`.
    DelayAfterData(Duration),
}

/// One message the sink received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `MAIL FROM` address.
    pub mail_from: String,
    /// `RCPT TO` addresses.
    pub rcpt_to: Vec<String>,
    /// The content, dot-stuffing undone.
    pub data: String,
    /// The Message-ID header, unfolded (`<...>`).
    pub message_id: Option<String>,
    /// How the sink answered: `accepted`, `dropped`, `delayed`, or the code it replied.
    pub answer: String,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    next: VecDeque<Behaviour>,
    default: Option<Behaviour>,
    connections: u64,
}

/// A running sink.
#[derive(Clone)]
pub struct SmtpSink {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl SmtpSink {
    /// Starts on an ephemeral loopback port.
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                shared.lock().unwrap().connections += 1;
                let st = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, st).await;
                });
            }
        });
        SmtpSink { addr, state }
    }

    /// The next transactions (one each, in order) behave like this; then the default.
    pub fn push(&self, b: Behaviour) {
        self.state.lock().unwrap().next.push_back(b);
    }

    /// What every transaction does when nothing was pushed (initially `Accept`).
    pub fn set_default(&self, b: Behaviour) {
        self.state.lock().unwrap().default = Some(b);
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Messages received with this Message-ID (any answer).
    pub fn with_message_id(&self, id: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.message_id.as_deref() == Some(id))
            .collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.lock().unwrap().connections
    }
}

/// The Message-ID header of a message, unfolded.
pub fn message_id_of(data: &str) -> Option<String> {
    let head = data.split("\r\n\r\n").next().unwrap_or("");
    let mut unfolded: Vec<String> = Vec::new();
    for line in head.split("\r\n") {
        if line.starts_with([' ', '\t']) {
            if let Some(last) = unfolded.last_mut() {
                last.push_str(line.trim_start());
            }
        } else {
            unfolded.push(line.to_string());
        }
    }
    unfolded.iter().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("message-id")
            .then(|| value.trim().to_string())
    })
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    write
        .write_all(b"220 sink.test ESMTP claimd test sink\r\n")
        .await?;
    let mut from = String::new();
    let mut rcpt: Vec<String> = Vec::new();
    let mut behaviour: Option<Behaviour> = None;
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let cmd = line.trim_end_matches(['\r', '\n']).to_string();
        let upper = cmd.to_ascii_uppercase();
        if upper.starts_with("EHLO") {
            write
                .write_all(
                    b"250-sink.test\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 10485760\r\n",
                )
                .await?;
        } else if upper.starts_with("HELO") {
            write.write_all(b"250 sink.test\r\n").await?;
        } else if upper.starts_with("MAIL FROM:") {
            from = addr_of(&cmd[10..]);
            rcpt.clear();
            behaviour = Some({
                let mut s = state.lock().unwrap();
                s.next
                    .pop_front()
                    .or_else(|| s.default.clone())
                    .unwrap_or(Behaviour::Accept)
            });
            write.write_all(b"250 2.1.0 Ok\r\n").await?;
        } else if upper.starts_with("RCPT TO:") {
            if let Some(Behaviour::RcptReply(code)) = behaviour {
                write
                    .write_all(format!("{code} 5.1.1 scripted recipient answer\r\n").as_bytes())
                    .await?;
                continue;
            }
            rcpt.push(addr_of(&cmd[8..]));
            write.write_all(b"250 2.1.5 Ok\r\n").await?;
        } else if upper == "DATA" {
            if rcpt.is_empty() {
                write
                    .write_all(b"554 5.5.1 no valid recipients\r\n")
                    .await?;
                continue;
            }
            write
                .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                .await?;
            let mut data = String::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                if line == ".\r\n" || line == ".\n" {
                    break;
                }
                let l = line
                    .strip_prefix('.')
                    .filter(|_| line.starts_with(".."))
                    .unwrap_or(&line);
                data.push_str(l);
            }
            let b = behaviour.take().unwrap_or(Behaviour::Accept);
            let answer = match &b {
                Behaviour::Accept | Behaviour::RcptReply(_) => "accepted".to_string(),
                Behaviour::DataReply(code) => code.to_string(),
                Behaviour::DropAfterData => "dropped".to_string(),
                Behaviour::DelayAfterData(_) => "delayed".to_string(),
            };
            let n = {
                let mut s = state.lock().unwrap();
                s.received.push(Received {
                    mail_from: from.clone(),
                    rcpt_to: rcpt.clone(),
                    message_id: message_id_of(&data),
                    data,
                    answer,
                });
                s.received.len()
            };
            match b {
                Behaviour::Accept | Behaviour::RcptReply(_) => {
                    write
                        .write_all(format!("250 2.0.0 Ok: queued as Q{n}\r\n").as_bytes())
                        .await?;
                }
                Behaviour::DataReply(code) => {
                    write
                        .write_all(format!("{code} scripted answer to the content\r\n").as_bytes())
                        .await?;
                }
                Behaviour::DropAfterData => return Ok(()),
                Behaviour::DelayAfterData(d) => {
                    tokio::time::sleep(d).await;
                    write
                        .write_all(format!("250 2.0.0 Ok: queued as Q{n}\r\n").as_bytes())
                        .await?;
                }
            }
            rcpt.clear();
        } else if upper == "RSET" {
            rcpt.clear();
            behaviour = None;
            write.write_all(b"250 2.0.0 Ok\r\n").await?;
        } else if upper == "NOOP" {
            write.write_all(b"250 2.0.0 Ok\r\n").await?;
        } else if upper == "QUIT" {
            write.write_all(b"221 2.0.0 Bye\r\n").await?;
            return Ok(());
        } else {
            write
                .write_all(b"502 5.5.2 Command not recognized\r\n")
                .await?;
        }
    }
}

/// `<a@b> PARAM=x` -> `a@b`.
fn addr_of(rest: &str) -> String {
    let rest = rest.trim();
    match (rest.find('<'), rest.find('>')) {
        (Some(a), Some(b)) if a < b => rest[a + 1..b].to_string(),
        _ => rest.split_whitespace().next().unwrap_or("").to_string(),
    }
}
