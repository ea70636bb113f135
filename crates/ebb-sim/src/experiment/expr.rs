//! The expression language of checks and templates: numbers, run metrics, `+ - * /`, unary
//! minus, `min`, `max`, `abs` and parentheses, parsed once into a tree (grammar in the
//! experiment module doc) and evaluated over the runs' metrics.

use std::fmt;

use super::RunMetrics;

/// A parsed check expression over run metrics; see the module doc for the grammar.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    source: String,
    node: Node,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Number(f64),
    Metric { run: String, metric: String },
    Neg(Box<Node>),
    Binary(BinaryOp, Box<Node>, Box<Node>),
    Call(Func, Vec<Node>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Func {
    Min,
    Max,
    Abs,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Number(f64),
    Metric(String, String),
    Func(Func),
    Op(char),
    Open,
    Close,
    Comma,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

fn tokenize(source: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i < chars.len() && matches!(chars[i], 'e' | 'E') {
                let mut j = i + 1;
                if j < chars.len() && matches!(chars[j], '+' | '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value = text.parse().map_err(|_| format!("bad number {text:?}"))?;
            tokens.push(Token::Number(value));
            if i < chars.len() && (chars[i].is_ascii_alphabetic() || chars[i] == ':') {
                return Err(format!(
                    "a number is followed by {:?} at character {}; run names start with a letter",
                    chars[i],
                    i + 1
                ));
            }
        } else if c.is_ascii_alphabetic() {
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if chars.get(i) == Some(&':') {
                i += 1;
                let metric_start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let metric: String = chars[metric_start..i].iter().collect();
                if metric.is_empty() {
                    return Err(format!("{word}: has no metric name after ':'"));
                }
                if !word.contains('/') {
                    return Err(format!("{word:?} is not a run name <case>/<variant>"));
                }
                tokens.push(Token::Metric(word, metric));
            } else {
                let func = match word.as_str() {
                    "min" => Func::Min,
                    "max" => Func::Max,
                    "abs" => Func::Abs,
                    _ => {
                        return Err(format!(
                            "{word:?} is neither a reference <case>/<variant>:<metric> nor one of \
                             the functions min, max, abs"
                        ));
                    }
                };
                tokens.push(Token::Func(func));
            }
        } else {
            tokens.push(match c {
                '+' | '-' | '*' | '/' => Token::Op(c),
                '(' => Token::Open,
                ')' => Token::Close,
                ',' => Token::Comma,
                _ => return Err(format!("unexpected {c:?} at character {}", i + 1)),
            });
            i += 1;
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn expr(&mut self, depth: usize) -> Result<Node, String> {
        if depth > 64 {
            return Err("expression nested too deeply".to_owned());
        }
        let mut node = self.term(depth)?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek() {
            let op = if *op == '+' { BinaryOp::Add } else { BinaryOp::Sub };
            self.at += 1;
            let right = self.term(depth)?;
            node = Node::Binary(op, Box::new(node), Box::new(right));
        }
        Ok(node)
    }

    fn term(&mut self, depth: usize) -> Result<Node, String> {
        let mut node = self.unary(depth)?;
        while let Some(Token::Op(op @ ('*' | '/'))) = self.peek() {
            let op = if *op == '*' { BinaryOp::Mul } else { BinaryOp::Div };
            self.at += 1;
            let right = self.unary(depth)?;
            node = Node::Binary(op, Box::new(node), Box::new(right));
        }
        Ok(node)
    }

    fn unary(&mut self, depth: usize) -> Result<Node, String> {
        if self.peek() == Some(&Token::Op('-')) {
            self.at += 1;
            if depth > 64 {
                return Err("expression nested too deeply".to_owned());
            }
            return Ok(Node::Neg(Box::new(self.unary(depth + 1)?)));
        }
        self.primary(depth)
    }

    fn primary(&mut self, depth: usize) -> Result<Node, String> {
        match self.next() {
            Some(Token::Number(value)) => Ok(Node::Number(value)),
            Some(Token::Metric(run, metric)) => Ok(Node::Metric { run, metric }),
            Some(Token::Open) => {
                let node = self.expr(depth + 1)?;
                self.expect_close()?;
                Ok(node)
            }
            Some(Token::Func(func)) => {
                if self.next() != Some(Token::Open) {
                    return Err("a function name must be followed by '('".to_owned());
                }
                let mut args = vec![self.expr(depth + 1)?];
                while self.peek() == Some(&Token::Comma) {
                    self.at += 1;
                    args.push(self.expr(depth + 1)?);
                }
                self.expect_close()?;
                if func == Func::Abs && args.len() != 1 {
                    return Err(format!("abs takes one argument, not {}", args.len()));
                }
                Ok(Node::Call(func, args))
            }
            Some(token) => Err(format!("unexpected {}", describe(&token))),
            None => Err("the expression ends too early".to_owned()),
        }
    }

    fn expect_close(&mut self) -> Result<(), String> {
        match self.next() {
            Some(Token::Close) => Ok(()),
            Some(token) => Err(format!("expected ')', found {}", describe(&token))),
            None => Err("missing ')'".to_owned()),
        }
    }
}

fn describe(token: &Token) -> String {
    match token {
        Token::Number(value) => format!("number {value}"),
        Token::Metric(run, metric) => format!("reference {run}:{metric}"),
        Token::Func(_) => "function name".to_owned(),
        Token::Op(op) => format!("'{op}'"),
        Token::Open => "'('".to_owned(),
        Token::Close => "')'".to_owned(),
        Token::Comma => "','".to_owned(),
    }
}

/// Why an expression has no value on a set of results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalError(pub String);

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EvalError {}

impl Expr {
    /// Parses `source`; the error says what is wrong.
    pub fn parse(source: &str) -> Result<Expr, String> {
        let tokens = tokenize(source).map_err(|reason| format!("in {source:?}: {reason}"))?;
        if tokens.is_empty() {
            return Err("empty expression".to_owned());
        }
        let mut parser = Parser { tokens, at: 0 };
        let node = parser.expr(0).map_err(|reason| format!("in {source:?}: {reason}"))?;
        if let Some(token) = parser.peek() {
            return Err(format!(
                "in {source:?}: unexpected {} after the expression",
                describe(token)
            ));
        }
        let source = source.split_whitespace().collect::<Vec<_>>().join(" ");
        Ok(Expr { source, node })
    }

    /// The text it was parsed from, with each run of white space made one space.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every `(run, metric)` the expression reads, in order of appearance.
    pub fn references(&self) -> Vec<(&str, &str)> {
        fn walk<'a>(node: &'a Node, out: &mut Vec<(&'a str, &'a str)>) {
            match node {
                Node::Number(_) => {}
                Node::Metric { run, metric } => out.push((run, metric)),
                Node::Neg(inner) => walk(inner, out),
                Node::Binary(_, left, right) => {
                    walk(left, out);
                    walk(right, out);
                }
                Node::Call(_, args) => args.iter().for_each(|arg| walk(arg, out)),
            }
        }
        let mut out = Vec::new();
        walk(&self.node, &mut out);
        out
    }

    /// The value on `metrics`; a missing run or metric, or a non-finite intermediate value
    /// (division by zero), is an error.
    pub fn eval(&self, metrics: &RunMetrics) -> Result<f64, EvalError> {
        eval_node(&self.node, metrics)
    }
}

fn eval_node(node: &Node, metrics: &RunMetrics) -> Result<f64, EvalError> {
    let value = match node {
        Node::Number(value) => *value,
        Node::Metric { run, metric } => {
            let run_metrics =
                metrics.get(run).ok_or_else(|| EvalError(format!("no results for run {run}")))?;
            *run_metrics
                .get(metric)
                .ok_or_else(|| EvalError(format!("run {run} has no metric {metric}")))?
        }
        Node::Neg(inner) => -eval_node(inner, metrics)?,
        Node::Binary(op, left, right) => {
            let left = eval_node(left, metrics)?;
            let right = eval_node(right, metrics)?;
            match op {
                BinaryOp::Add => left + right,
                BinaryOp::Sub => left - right,
                BinaryOp::Mul => left * right,
                BinaryOp::Div => {
                    if right == 0.0 {
                        return Err(EvalError(format!("division of {left} by zero")));
                    }
                    left / right
                }
            }
        }
        Node::Call(func, args) => {
            let values =
                args.iter().map(|arg| eval_node(arg, metrics)).collect::<Result<Vec<_>, _>>()?;
            match func {
                Func::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
                Func::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                Func::Abs => values[0].abs(),
            }
        }
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(EvalError(format!("a value is not finite ({value})")))
    }
}
