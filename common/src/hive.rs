//! Names and values as they go into the Hive DDL Ferry writes (`ddl.sql`, `schema-v<N>.sql`).
//! Whatever a name holds, the statements stay the ones Ferry meant: identifiers are quoted
//! with backticks (a backtick inside doubled, as Hive reads it), literals with single quotes
//! (backslash and quote escaped), and a name Hive cannot hold at all is refused up front.

/// `name` as a quoted Hive identifier: `` `a``b` `` for a name holding a backtick.
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// `value` as a Hive string literal.
pub fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Why Hive cannot hold `name` as a column or table name, if it cannot: an empty name, or
/// one with a control character (a newline would also end the `--` comment lines of the DDL).
pub fn unfit_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a name must not be empty".into());
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Some(format!("{name:?} holds the control character {c:?}, which a Hive name cannot"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_the_statement_whole() {
        assert_eq!(ident("plain"), "`plain`");
        assert_eq!(ident("a`) STORED AS TEXTFILE; --"), "`a``) STORED AS TEXTFILE; --`");
        assert_eq!(literal("it's \\ here"), "'it\\'s \\\\ here'");
        assert!(unfit_name("ok name").is_none());
        assert!(unfit_name("").is_some());
        assert!(unfit_name("a\nb").unwrap().contains("control"));
    }
}
