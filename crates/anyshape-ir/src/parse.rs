//! The parser for integer expressions (`16*T`, `ceildiv(T, 8)`, `min(T, 4) % 3`).
//!
//! Grammar: `expr := term (("+"|"-") term)*`, `term := unary (("*"|"/"|"%") unary)*`,
//! `unary := "-" unary | atom`, `atom := INT | NAME | NAME "(" expr ("," expr)* ")" | "(" expr ")"`.
//! Functions: `min`, `max`, `ceildiv`, `floordiv`. `/` is floor division.
//!
//! Input is bounded so that no text can exhaust the stack: at most [`MAX_EXPR_LEN`]
//! bytes besides whitespace, at most [`MAX_NESTING`] levels of parentheses, calls and
//! unary minus.
use crate::{Expr, ParseError};

/// The longest expression text accepted, in bytes besides whitespace (shapes need a few
/// dozen); with whitespace, at most 16 times as much.
pub const MAX_EXPR_LEN: usize = 1024;
/// The deepest nesting of parentheses, function calls and unary minus accepted.
pub const MAX_NESTING: usize = 32;

/// Parse an integer expression; errors point at the offending character.
///
/// What is accepted can be written out and read back: an expression whose printed
/// (canonical) form would break the limits is refused here, so records and manifests
/// that store printed expressions are always readable.
pub fn parse_expr(text: &str) -> Result<Expr, ParseError> {
    let e = parse_text(text)?;
    let printed = e.to_string();
    if printed != text {
        parse_text(&printed).map_err(|err| ParseError {
            text: text.to_string(),
            pos: 0,
            message: format!("too large once written out: {}", err.message),
        })?;
    }
    Ok(e)
}

/// [`parse_expr`] without the check of the printed form.
fn parse_text(text: &str) -> Result<Expr, ParseError> {
    let significant = text.bytes().filter(|b| !b.is_ascii_whitespace()).count();
    if significant > MAX_EXPR_LEN || text.len() > 16 * MAX_EXPR_LEN {
        return Err(ParseError {
            text: text.chars().take(80).collect::<String>() + "...",
            pos: 0,
            message: format!(
                "expression of {significant} bytes; at most {MAX_EXPR_LEN} are accepted"
            ),
        });
    }
    let mut p = Parser {
        text,
        pos: 0,
        depth: 0,
    };
    let e = p.expr()?;
    p.skip_ws();
    if p.pos < text.len() {
        return Err(p.error("unexpected text after the expression"));
    }
    Ok(e)
}

/// Split `text` at top-level occurrences of `sep` (not inside parentheses), returning
/// each piece with its byte offset.
pub fn split_top_level(text: &str, sep: char) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, ch) in text.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push((start, &text[start..i]));
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push((start, &text[start..]));
    out
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// Current nesting of parentheses, calls and unary minus.
    depth: usize,
}

impl Parser<'_> {
    fn error(&self, message: &str) -> ParseError {
        ParseError {
            text: self.text.to_string(),
            pos: self.pos,
            message: message.to_string(),
        }
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.term()?;
        loop {
            if self.eat('+') {
                e = e + self.term()?;
            } else if self.eat('-') {
                e = e - self.term()?;
            } else {
                return Ok(e);
            }
        }
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut e = self.unary()?;
        loop {
            let at = self.pos;
            if self.eat('*') {
                e = e * self.unary()?;
            } else if self.eat('/') || self.eat('%') {
                let op = self.text[..self.pos].chars().last();
                let rhs = self.unary()?;
                if rhs.as_const() == Some(0) {
                    self.pos = at;
                    return Err(self.error("division by zero"));
                }
                e = if op == Some('/') { e / rhs } else { e % rhs };
            } else {
                return Ok(e);
            }
        }
    }

    /// Run `f` one nesting level deeper, refusing to go past [`MAX_NESTING`].
    fn nested<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ParseError>,
    ) -> Result<T, ParseError> {
        if self.depth >= MAX_NESTING {
            return Err(self.error(&format!("nested more than {MAX_NESTING} levels deep")));
        }
        self.depth += 1;
        let out = f(self);
        self.depth -= 1;
        out
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.eat('-') {
            return self.nested(|p| Ok(Expr::Const(0) - p.unary()?));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        self.skip_ws();
        let start = self.pos;
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                self.text[start..self.pos]
                    .parse()
                    .map(Expr::Const)
                    .map_err(|_| {
                        self.pos = start;
                        self.error("integer too large")
                    })
            }
            // A run-time dim's var (`?12_0`, in a saved plan) reads as a name too.
            Some(c) if c.is_ascii_alphabetic() || c == '_' || c == crate::RUNTIME_DIM => {
                self.pos += c.len_utf8();
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    self.pos += 1;
                }
                let name = &self.text[start..self.pos];
                if !self.eat('(') {
                    return Ok(Expr::var(name));
                }
                let args = self.nested(|p| {
                    let mut args = vec![p.expr()?];
                    while p.eat(',') {
                        args.push(p.expr()?);
                    }
                    if !p.eat(')') {
                        return Err(p.error("expected `,` or `)`"));
                    }
                    Ok(args)
                })?;
                let [a, b]: [Expr; 2] = args.try_into().map_err(|_| ParseError {
                    text: self.text.to_string(),
                    pos: start,
                    message: format!("`{name}` takes two arguments"),
                })?;
                match name {
                    "min" => Ok(Expr::min(a, b)),
                    "max" => Ok(Expr::max(a, b)),
                    "ceildiv" => Ok(Expr::ceil_div(a, b)),
                    "floordiv" => Ok(Expr::floor_div(a, b)),
                    _ => Err(ParseError {
                        text: self.text.to_string(),
                        pos: start,
                        message: format!(
                            "unknown function `{name}` (known: min, max, ceildiv, floordiv)"
                        ),
                    }),
                }
            }
            Some('(') => {
                self.pos += 1;
                self.nested(|p| {
                    let e = p.expr()?;
                    if !p.eat(')') {
                        return Err(p.error("expected `)`"));
                    }
                    Ok(e)
                })
            }
            Some(_) => Err(self.error("expected a number, a name or `(`")),
            None => Err(self.error("expected a number, a name or `(` but the text ends")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bindings;

    #[test]
    fn parses_command_line_forms() {
        let b = Bindings::from_pairs([("T", 5)]);
        for (s, v) in [
            ("16*T", 80),
            ("16 * T + 1", 81),
            ("-T", -5),
            ("ceildiv(T, 2)", 3),
            ("T/2", 2),
            ("T % 3", 2),
            ("max(T, 7) - min(T, 2)", 5),
            ("(T+1)*(T-1)", 24),
            ("2*3*T", 30),
        ] {
            assert_eq!(parse_expr(s).unwrap().eval(&b).unwrap(), v, "{s}");
        }
    }

    #[test]
    fn errors_point_at_the_problem() {
        for (s, pos) in [
            ("16*", 3),
            ("16 $ T", 3),
            ("(T+1", 4),
            ("T)", 1),
            ("foo(T, 1)", 0),
            ("min(T)", 0),
            ("T/0", 1),
        ] {
            let e = parse_expr(s).unwrap_err();
            assert_eq!(e.pos, pos, "{s}: {e}");
            assert!(e.to_string().contains('^'));
        }
    }

    #[test]
    fn deep_or_long_text_is_refused_not_a_stack_overflow() {
        let deep = format!("{}T{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(parse_expr(&deep).unwrap_err().message.contains("bytes"));
        let nested = format!("{}T{}", "(".repeat(40), ")".repeat(40));
        assert!(parse_expr(&nested).unwrap_err().message.contains("nested"));
        let calls = format!("{}T{}", "min(".repeat(40), ",1)".repeat(40));
        assert!(parse_expr(&calls).unwrap_err().message.contains("nested"));
        assert!(parse_expr(&"-".repeat(40)).is_err());
        let ok = format!("{}T{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
        assert!(parse_expr(&ok).is_ok());
        // The longest chain the length allows still evaluates.
        let chain = vec!["T"; MAX_EXPR_LEN / 2].join("+");
        let e = parse_expr(&chain).unwrap();
        let b = crate::Bindings::from_pairs([("T", 1)]);
        assert_eq!(e.eval(&b).unwrap(), (MAX_EXPR_LEN / 2) as i64);
        // Whatever is accepted reads back from its printed form (`T*T` prints longer,
        // as `T * T`): found by the fuzzer.
        let product = vec!["T"; MAX_EXPR_LEN / 2].join("*");
        match parse_expr(&product) {
            Ok(e) => assert_eq!(parse_expr(&e.to_string()).unwrap(), e),
            Err(err) => assert!(err.message.contains("written out"), "{err}"),
        }
    }

    #[test]
    fn splits_at_top_level_only() {
        let parts: Vec<_> = split_top_level("M=min(T,2),N=3", ',')
            .into_iter()
            .map(|p| p.1)
            .collect();
        assert_eq!(parts, ["M=min(T,2)", "N=3"]);
    }
}
