//! The built-in demo MCP server both binaries run when no backend command is given, so the
//! first `cargo run` serves something real. Pure: one request line in, output lines out;
//! the shells run it on stdin/stdout in a re-executed child process.

use serde_json::{json, Value};

/// The protocol version the demo server speaks.
pub(crate) const PROTOCOL_VERSION: &str = "2024-11-05";

/// Serves `input` line by line until it ends, writing answers to `output`. Generic over
/// the streams so the core stays free of real I/O; the shells pass stdin and stdout.
pub fn serve(input: impl std::io::BufRead, mut output: impl std::io::Write) -> std::io::Result<()> {
    for line in input.split(b'\n') {
        let line = line?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        for answer in handle_line(&line) {
            output.write_all(answer.as_bytes())?;
            output.write_all(b"\n")?;
        }
        output.flush()?;
    }
    Ok(())
}

/// Answers one line read on stdin with the lines to write on stdout (each without `\n`).
pub(crate) fn handle_line(line: &[u8]) -> Vec<String> {
    let Ok(request) = serde_json::from_slice::<Value>(line) else {
        return vec![error(Value::Null, -32700, "Parse error")];
    };
    let id = request.get("id").cloned();
    let method = request.get("method").and_then(Value::as_str).unwrap_or("");
    let Some(id) = id else {
        // Notifications (initialized, cancelled) need no answer.
        return Vec::new();
    };
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    match method {
        "initialize" => vec![result(
            id,
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "switchboard-demo", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "A demo server built into Switchboard: try the echo, add and countdown tools."
            }),
        )],
        "ping" => vec![result(id, json!({}))],
        "tools/list" => vec![result(id, json!({"tools": tools()}))],
        "tools/call" => call_tool(id, &params),
        _ => vec![error(id, -32601, &format!("Method not found: {method}"))],
    }
}

fn tools() -> Value {
    json!([
        {
            "name": "echo",
            "description": "Returns the text it is given.",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        },
        {
            "name": "add",
            "description": "Adds two integers.",
            "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
        },
        {
            "name": "countdown",
            "description": "Counts down from n (at most 100), reporting each step as progress.",
            "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        }
    ])
}

fn call_tool(id: Value, params: &Value) -> Vec<String> {
    let args = params.get("arguments").cloned().unwrap_or(Value::Null);
    let name = params.get("name").and_then(Value::as_str).unwrap_or("");
    match name {
        "echo" => {
            let text = args.get("text").and_then(Value::as_str).unwrap_or("");
            vec![result(id, text_content(text))]
        }
        "add" => match (
            args.get("a").and_then(Value::as_i64),
            args.get("b").and_then(Value::as_i64),
        ) {
            (Some(a), Some(b)) => match a.checked_add(b) {
                Some(sum) => vec![result(id, text_content(&sum.to_string()))],
                None => vec![tool_error(id, "overflow")],
            },
            _ => vec![tool_error(id, "a and b must be integers")],
        },
        "countdown" => {
            let n = args.get("n").and_then(Value::as_u64).unwrap_or(3).min(100);
            let token = params
                .get("_meta")
                .and_then(|m| m.get("progressToken"))
                .cloned();
            let mut out = Vec::new();
            if let Some(token) = token {
                for step in 1..=n {
                    out.push(
                        json!({
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": step, "total": n}
                        })
                        .to_string(),
                    );
                }
            }
            out.push(result(id, text_content(&format!("counted down from {n}"))));
            out
        }
        _ => vec![error(id, -32602, &format!("Unknown tool: {name}"))],
    }
}

fn text_content(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": false})
}

fn tool_error(id: Value, text: &str) -> String {
    result(
        id,
        json!({"content": [{"type": "text", "text": text}], "isError": true}),
    )
}

fn result(id: Value, result: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

fn error(id: Value, code: i32, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_reports_progress() {
        let out = handle_line(br#"{"jsonrpc":"2.0","id":"x|n:1","method":"tools/call","params":{"name":"countdown","arguments":{"n":2},"_meta":{"progressToken":"t"}}}"#);
        assert_eq!(out.len(), 3);
        assert!(out[0].contains(r#""progressToken":"t""#));
        assert!(out[2].contains(r#""id":"x|n:1""#));
        assert!(
            handle_line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_empty()
        );
        let add = handle_line(br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":2,"b":40}}}"#);
        assert!(add[0].contains(r#""text":"42""#));
    }
}
