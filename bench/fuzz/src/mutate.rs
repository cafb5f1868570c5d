//! Mutations of one input, for the in-process runner (`loom-fuzz`): the
//! stacked byte-level mutations of libFuzzer and AFL (flips, interesting
//! bytes and numbers, insertions, deletions, copies, splices with another
//! input) and tokens of the formats the targets read (JSON, SSE, TOML,
//! paths, HTTP), so that inputs stay near the shapes the parsers take.

/// The largest input made.
pub const MAX_LEN: usize = 64 * 1024;

/// Tokens worth inserting whole: pieces of the formats the targets read.
const TOKENS: &[&[u8]] = &[
    b"\"",
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"null",
    b"true",
    b"false",
    b"\"\":",
    b"\\u0000",
    b"\\ud800",
    b"\\\"",
    b"0",
    b"-1",
    b"1e999",
    b"-0",
    b"18446744073709551616",
    b"9007199254740993",
    b"data: ",
    b"event: ",
    b"id: ",
    b"retry: ",
    b"\n\n",
    b"\r\n",
    b"\r",
    b": ping\n",
    b"[DONE]",
    b"\"index\":",
    b"\"tool_calls\":",
    b"\"arguments\":",
    b"\"name\":",
    b"\"choices\":",
    b"\"delta\":",
    b"\"type\":",
    b"\"content_block_delta\"",
    b"\"input_json_delta\"",
    b"\"partial_json\":",
    b"\"message_stop\"",
    b"\"usage\":",
    b"\"finish_reason\":",
    b"\"stop_reason\":",
    b"\"error\":",
    b"<tool_call>",
    b"</tool_call>",
    b"<tool_",
    b"\"method\":",
    b"\"payload\":",
    b"\"id\":",
    b"\"request\"",
    b"\"runId\":",
    b"\"agent.run\"",
    b"\"run.list\"",
    b"\"permission.respond\"",
    b"/",
    b"..",
    b"../",
    b"./",
    b"//",
    b"~",
    b"\0",
    b"%2e%2e",
    b"/proc/self/",
    b"leak",
    b"out/",
    b"slash/",
    b"src/up",
    b"?",
    b"&",
    b"=",
    b"#",
    b"%",
    b"%00",
    b"GET ",
    b"POST ",
    b"DELETE ",
    b"/v1/runs",
    b"/v1/runs/",
    b"/events",
    b"/cancel",
    b"/steer",
    b"/permissions/",
    b"/v1/audit",
    b"/v1/session",
    b"/ws",
    b"HEAD ",
    b"authorization: Bearer ",
    b"content-type: application/json",
    b"origin: ",
    b"cookie: loom_session_",
    b"last-event-id: ",
    b"idempotency-key: ",
    b"[[tokens]]",
    b"role = ",
    b"\"admin\"",
    b"\"viewer\"",
    b" = ",
    b"'''",
    b"\"\"\"",
    b"\n[",
    b"[server]\n",
    b"[tools.bash]\n",
    b"[[server.tokens]]\n",
    b"[provider.headers]\n",
    b"[prices.\"",
    b"[mcp.servers.",
    b"---\n",
    b"\n---\n",
    b"name: ",
    b"description: ",
    b"tools: ",
    b"max_steps: ",
    b"model: ",
    b"&a ",
    b"*a",
    b"!!",
    b"|\n",
    b">-\n",
    b"- ",
    b"  ",
    b"\t",
    b"\xc3",
    b"\xe2\x80\xae",
    b"\xf0\x9f\x98\x80",
    b"\xff",
];

/// Bytes a parser tends to treat specially.
const BYTES: &[u8] = b"\0\x01\x7f\xff\"\\{}[]:,\n\r\t 0-./<>=&?%#";

/// Numbers at the edges of the integer types, as text.
const NUMBERS: &[&[u8]] = &[
    b"0",
    b"1",
    b"-1",
    b"255",
    b"256",
    b"65535",
    b"4294967295",
    b"4294967296",
    b"2147483648",
    b"9223372036854775807",
    b"9223372036854775808",
    b"18446744073709551615",
    b"1e308",
    b"0.5",
];

/// The mutations' source of chance: seeded, so a campaign repeats.
pub struct Rng(fastrand::Rng);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    /// A number below `bound` (0 for a bound of 0).
    pub fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            0
        } else {
            self.0.usize(..bound)
        }
    }

    /// A byte.
    fn byte(&mut self) -> u8 {
        self.0.u8(..)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// `input` changed by one to five mutations; `other` is a second input to
/// splice from.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..=rng.below(5) {
        mutate_once(rng, input, other);
    }
    input.truncate(MAX_LEN);
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    let len = input.len();
    match rng.below(11) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = *rng.pick(BYTES);
        }
        2 if len > 0 => {
            let at = rng.below(len);
            input[at] = rng.byte();
        }
        3 => {
            let at = rng.below(len + 1);
            let token = *rng.pick(TOKENS);
            input.splice(at..at, token.iter().copied());
        }
        4 if len > 0 => {
            let from = rng.below(len);
            let to = (from + 1 + rng.below(16)).min(len);
            input.drain(from..to);
        }
        5 if len > 0 => {
            // Duplicate a piece: repeated fields, nested openings.
            let from = rng.below(len);
            let to = (from + 1 + rng.below(64)).min(len);
            let piece: Vec<u8> = input[from..to].to_vec();
            let at = rng.below(len + 1);
            for _ in 0..=rng.below(4) {
                input.splice(at..at, piece.iter().copied());
            }
        }
        6 if !other.is_empty() => {
            // Splice: this input's head, the other's tail.
            let keep = rng.below(len + 1);
            let from = rng.below(other.len());
            input.truncate(keep);
            input.extend_from_slice(&other[from..]);
        }
        7 => {
            // A number where a number was, at an edge of its type.
            if let Some(at) = (0..len)
                .map(|i| (i + rng.below(len.max(1))) % len.max(1))
                .find(|&i| input[i].is_ascii_digit())
            {
                let end = (at..len).find(|&i| !input[i].is_ascii_digit()).unwrap_or(len);
                let number = *rng.pick(NUMBERS);
                input.splice(at..end, number.iter().copied());
            } else {
                let number = *rng.pick(NUMBERS);
                let at = rng.below(len + 1);
                input.splice(at..at, number.iter().copied());
            }
        }
        8 if len > 1 => {
            input.truncate(rng.below(len));
        }
        9 => {
            let at = rng.below(len + 1);
            let count = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..count).map(|_| rng.byte()).collect();
            input.splice(at..at, bytes);
        }
        _ if len > 0 => {
            // Overwrite with a piece of the other input.
            if !other.is_empty() {
                let from = rng.below(other.len());
                let piece = &other[from..(from + 1 + rng.below(32)).min(other.len())];
                let at = rng.below(len);
                let end = (at + piece.len()).min(len);
                input.splice(at..end, piece.iter().copied());
            }
        }
        _ => input.push(*rng.pick(BYTES)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_bounded_and_change_the_input() {
        let mut rng = Rng::new(7);
        let seed = b"{\"type\":\"request\",\"id\":1}".to_vec();
        let mut changed = 0;
        for _ in 0..10_000 {
            let mut input = seed.clone();
            mutate(&mut rng, &mut input, b"data: x\n\n");
            assert!(input.len() <= MAX_LEN);
            changed += usize::from(input != seed);
        }
        assert!(changed > 9_000, "{changed}");
    }
}
