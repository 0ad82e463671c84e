//! Test fixtures, by what they help with: free ports (`ports`), the Redis servers a test
//! owns (`redis`), the app in this process or as the real binary (`app`), waits aligned on
//! the clock's windows (`clock`), and waiting for what a test observes (`wait`). Each is
//! re-exported here: tests name them `crate::helpers::X`.

mod app;
mod clock;
mod ports;
mod redis;
mod wait;

pub use self::{
    app::{
        ADMIN_KEY, AppProcess, SERVICE_KEY, TestApp, app_state, serve, spawn_app, spawn_app_with,
    },
    clock::{at_least_before_window_turn, clear_of_window_turn},
    ports::{free_port, free_ports},
    redis::{RedisCluster, RedisServer},
    wait::{PATIENCE, eventually, eventually_sync},
};
