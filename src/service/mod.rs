//! The service: the application assembled from its parts (`app`), `claimd run` (`run`) and the
//! embeddable [`Worker`](crate::Worker) (`worker`).

pub mod app;
pub mod run;
pub mod worker;
