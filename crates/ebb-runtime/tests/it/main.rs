//! The runtime against real threads, real time and real backends.

mod budget;
mod crash;
mod dirty_seconds;
mod durable;
mod errors;
mod interrupt;
mod io;
mod network_wbt;
mod nfs;
mod nonblocking;
mod racing;
mod s3;
mod second_client;
mod seeded;
mod swarm;
mod threads;
mod trace;
mod trim;
