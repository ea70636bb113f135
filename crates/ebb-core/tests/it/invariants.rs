//! Property tests: random event sequences keep the accounting exact and lose no page.
