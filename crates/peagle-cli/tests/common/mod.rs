//! Test support shared by the CLI tests.
#![allow(dead_code)]

pub mod fake_hub;
