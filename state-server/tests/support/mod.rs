pub mod oracle;
pub mod worker;
