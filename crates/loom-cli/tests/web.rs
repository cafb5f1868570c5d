//! The web page in a real browser: Debian's Chromium, headless with a fresh
//! profile, driven over WebDriver (chromedriver) against a real
//! `loom serve` and the fake model. `.ci/run` installs both; a machine
//! without them fails these tests with the command that installs them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::gateway::{config, http, Gateway, ALICE, BOB};
use fantoccini::{Client, ClientBuilder, Locator};
use loom_testkit::{PromptModel, PromptModelOptions};
use serde_json::{json, Value};

/// chromedriver on a port of its own, killed with the test.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require(program: &str) {
    if Command::new(program).arg("--version").output().is_err() {
        panic!("{program} is not installed: the web tests need `apt-get install -y chromium chromium-driver` (.ci/run does it)");
    }
}

fn driver() -> Driver {
    require("chromium");
    require("chromedriver");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Driver { child, port }
}

/// A headless Chromium with a fresh profile and no background networking.
async fn browser(driver: &Driver, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_string(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    // The console, for `Page::console_errors`.
    caps.insert("goog:loggingPrefs".to_string(), json!({"browser": "ALL"}));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .unwrap()
}

struct Page {
    _dir: tempfile::TempDir,
    model: PromptModel,
    gateway: Gateway,
    driver: Driver,
    client: Client,
    _profile: tempfile::TempDir,
}

async fn page(args: &[&str]) -> Page {
    page_configured(args, "").await
}

/// A page on a gateway whose loom.toml also holds `extra`.
async fn page_configured(args: &[&str], extra: &str) -> Page {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    config(dir.path(), &model.url(), extra);
    let gateway = Gateway::start(dir.path(), args);
    let driver = driver();
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    client.goto(&gateway.url("/")).await.unwrap();
    Page {
        _dir: dir,
        model,
        gateway,
        driver,
        client,
        _profile: profile,
    }
}

impl Page {
    async fn sign_in(&self, token: &str) {
        // After a sign-out the page reloads: wait for the form to show.
        self.until("the sign-in form", "return !document.getElementById('sign-in').hidden;")
            .await;
        let field = self.client.wait().for_element(Locator::Id("token")).await.unwrap();
        field.send_keys(token).await.unwrap();
        self.client
            .find(Locator::Css("#sign-in-form button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Waits (up to 30 s) until `script` returns true.
    async fn until(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let value = self.client.execute(script, vec![]).await.unwrap();
            if value == Value::Bool(true) {
                return;
            }
            if Instant::now() > deadline {
                let html = self.text("#run").await;
                panic!("timed out waiting for {what}; the run view says:\n{html}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn text(&self, css: &str) -> String {
        let script = format!("const e = document.querySelector({css:?}); return e ? e.innerText : '';");
        self.client
            .execute(&script, vec![])
            .await
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    async fn count(&self, css: &str) -> u64 {
        let script = format!("return document.querySelectorAll({css:?}).length;");
        self.client.execute(&script, vec![]).await.unwrap().as_u64().unwrap()
    }

    async fn start_run(&self, prompt: &str) {
        let field = self.client.wait().for_element(Locator::Id("prompt")).await.unwrap();
        field.send_keys(prompt).await.unwrap();
        self.client
            .find(Locator::Id("start"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    async fn click(&self, css: &str) {
        self.client
            .wait()
            .for_element(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Errors the page wrote to the browser's console (ChromeDriver's log
    /// endpoint), leaving aside the 403 and 401 answers the tests provoke.
    async fn console_errors(&self) -> Vec<String> {
        let session = self.client.session_id().await.unwrap().unwrap();
        let url = format!("http://127.0.0.1:{}/session/{session}/se/log", self.driver.port);
        let log: Value = reqwest::Client::new()
            .post(url)
            .json(&json!({"type": "browser"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        log["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| entry["message"].as_str().unwrap_or_default().to_string())
            .filter(|message| !message.contains("401") && !message.contains("403"))
            .collect()
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let dir = artifacts();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), png).unwrap();
    }
}

/// Where screenshots go: `target/web-artifacts`.
fn artifacts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/web-artifacts")
}

const XSS: &str = "<img/src=x/onerror=document.title='pwned'>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_start_a_run_from_the_form_and_watch_its_tree_grow() {
    let page = page(&["--allow", "write_file"]).await;
    // A wrong token gets a clear message.
    page.sign_in("not-a-token").await;
    page.until(
        "the refusal",
        "return document.getElementById('sign-in-error').innerText.includes('not valid');",
    )
    .await;
    page.client
        .find(Locator::Id("token"))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();
    page.sign_in(ALICE).await;
    page.until("the signed-in page", "return !document.getElementById('app').hidden;")
        .await;
    assert!(page.text("#who").await.contains("alice"));

    // Two tool turns, streamed slowly, then an answer that is markup.
    page.start_run(&format!("build it steps=2 tool=write_file chunk_ms=40 answer={XSS}"))
        .await;
    page.until(
        "the first turn",
        "return document.querySelectorAll('#tree .turn').length >= 1;",
    )
    .await;
    page.until(
        "a tool call",
        "return document.querySelectorAll('#tree .call.success').length >= 1;",
    )
    .await;
    page.until(
        "the end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    assert_eq!(page.count("#tree .turn").await, 3);
    assert_eq!(page.count("#tree .call.success").await, 2);
    assert!(page.text("#tree").await.contains("write_file"));
    // The markup is shown as text and never runs.
    assert_eq!(page.text("#answer .text").await, XSS);
    assert_eq!(page.count("#run img").await, 0);
    assert_ne!(page.client.title().await.unwrap(), "pwned");
    // The runs list shows it, live.
    page.until(
        "the run in the list",
        "return document.querySelector('#run-table tbody tr .status')?.innerText === 'DONE';",
    )
    .await;
    page.screenshot("run-view.png").await;

    // A second token sees none of it.
    page.click("#sign-out").await;
    page.sign_in(BOB).await;
    page.until(
        "bob's page",
        "return document.getElementById('who').innerText.includes('bob');",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(page.count("#run-table tbody tr").await, 0);
    assert_eq!(page.console_errors().await, Vec::<String>::new());
    page.client.clone().close().await.unwrap();
}

/// A hook's decision shows under the call it decided, with who decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_tree_shows_what_each_hook_decided() {
    let page = page_configured(
        &["--allow", "write_file"],
        r#"
[[hooks]]
event = "pre_tool_use"
matcher = "write_file"
command = '''echo '{"decision": "deny", "reason": "no writes from the page today"}' '''
"#,
    )
    .await;
    page.sign_in(ALICE).await;
    page.until("the signed-in page", "return !document.getElementById('app').hidden;")
        .await;
    page.start_run("write it steps=1 tool=write_file").await;
    page.until(
        "the end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    let call = page.text("#tree .call.denied").await;
    assert!(call.contains("decided by hook"), "{call}");
    let hook = page.text("#tree .call.denied .hook").await;
    assert!(hook.starts_with("pre_tool_use hook echo"), "{hook}");
    assert!(hook.ends_with(": deny — no writes from the page today"), "{hook}");
    assert!(!page.gateway.dir.join("out_1.txt").exists());
    assert_eq!(page.console_errors().await, Vec::<String>::new());
    page.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_an_ask_by_clicking_reload_mid_run_and_cancel_by_clicking() {
    let page = page(&["--ask", "write_file"]).await;
    page.sign_in(ALICE).await;
    page.start_run("write steps=1 tool=write_file").await;
    page.until(
        "the ask",
        "return document.querySelectorAll('#asks .ask').length === 1;",
    )
    .await;
    assert!(page.text("#asks").await.contains("Allow write_file?"));
    page.click("#asks button[data-decision=allow]").await;
    page.until(
        "the tool to run",
        "return document.querySelectorAll('#tree .call.success').length === 1;",
    )
    .await;
    page.until(
        "the end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    assert_eq!(page.count("#asks .ask").await, 0);

    // A long run: reload in the middle, and the same tree comes back, then grows.
    page.start_run("slow steps=40 delay_ms=150").await;
    page.until(
        "three turns",
        "return document.querySelectorAll('#tree .turn').length >= 3;",
    )
    .await;
    let before = page.count("#tree .turn").await;
    page.client.refresh().await.unwrap();
    page.until(
        "the rebuilt tree",
        &format!("return document.querySelectorAll('#tree .turn').length >= {before};"),
    )
    .await;
    page.until(
        "more turns",
        &format!("return document.querySelectorAll('#tree .turn').length > {before};"),
    )
    .await;
    // Nothing doubled: turn numbers are 1, 2, 3, … once each.
    let numbers = page
        .client
        .execute(
            "return [...document.querySelectorAll('#tree > .turn > .meta')].map(m => m.innerText.split(' · ')[0]);",
            vec![],
        )
        .await
        .unwrap();
    let numbers: Vec<String> = serde_json::from_value(numbers).unwrap();
    let expected: Vec<String> = (1..=numbers.len()).map(|n| format!("turn {n}")).collect();
    assert_eq!(numbers, expected);

    // Steering goes to the running agent (the box empties once accepted).
    page.client
        .find(Locator::Id("steer"))
        .await
        .unwrap()
        .send_keys("please hurry")
        .await
        .unwrap();
    page.click("#steer-form button").await;
    page.until(
        "the steer to be accepted",
        "return document.getElementById('steer').value === '';",
    )
    .await;
    page.click("#cancel").await;
    page.until(
        "CANCELED",
        "return document.getElementById('run-status').innerText === 'CANCELED';",
    )
    .await;
    // The list filters by status: only the cancelled run is CANCELED.
    page.client
        .find(Locator::Css("#filter-status option[value=CANCELED]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    page.until(
        "the filtered list",
        "const rows = [...document.querySelectorAll('#run-table tbody tr')]; \
         return rows.length === 1 && rows[0].innerText.startsWith('CANCELED');",
    )
    .await;
    assert_eq!(page.console_errors().await, Vec::<String>::new());
    page.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_is_nested_under_its_call_and_cross_site_posts_are_refused() {
    let page = page_configured(&[], "[tools]\ntask = true").await;
    page.sign_in(ALICE).await;
    page.start_run("delegate steps=1 tool=task child=steps:1+tool:list_dir")
        .await;
    page.until(
        "the sub-agent",
        "return document.querySelectorAll('#tree .call .child .turn').length >= 1;",
    )
    .await;
    page.until(
        "the end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    page.until(
        "the list without the sub-agent",
        "return document.querySelectorAll('#run-table tbody tr').length === 1;",
    )
    .await;
    let child = page.text("#tree .call .child").await;
    assert!(child.contains("sub-agent"), "{child}");
    assert!(child.contains("list_dir"), "{child}");
    page.screenshot("sub-agent.png").await;

    // Reloaded while the parent still runs: a sub-agent that finished
    // before the reload is read from its own log at once, not when the
    // parent ends (its events were on the parent's stream live only).
    // (8 s of the parent's: a reload under the load of the other browser
    // tests on two cores took more than 4.)
    page.start_run("again steps=2 tool=task delay_ms=8000 child=steps:1+tool:list_dir")
        .await;
    // Of the new run: the finished one's tree has a sub-agent too, and a
    // reload before the page opened the new run would show that one again.
    page.until(
        "the first sub-agent, live",
        "const c = document.querySelector('#tree .call'); \
         return !!(c && c.querySelector('.child .turn')) \
           && document.getElementById('run-status').innerText === 'RUNNING';",
    )
    .await;
    page.client.refresh().await.unwrap();
    page.until(
        "the first sub-agent again while the parent runs",
        "const c = document.querySelector('#tree .call'); \
         return !!(c && c.querySelector('.child .turn')) \
           && document.getElementById('run-status').innerText === 'RUNNING';",
    )
    .await;
    let first = page.text("#tree .call .child").await;
    assert!(first.contains("list_dir"), "{first}");
    page.until(
        "the second sub-agent and the end",
        "return document.querySelectorAll('#tree .call .child .turn').length >= 4 \
           && document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;

    // The page's cookie from another origin changes nothing.
    let cookie = sign_in_cookie(&page.gateway).await;
    let refused = reqwest::Client::new()
        .post(page.gateway.url("/v1/runs"))
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .json(&json!({"prompt": "from elsewhere"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    // Without an Origin at all, too; reading with the cookie works.
    let bare = reqwest::Client::new()
        .post(page.gateway.url("/v1/runs"))
        .header("cookie", &cookie)
        .json(&json!({"prompt": "no origin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 403);
    let list = reqwest::Client::new()
        .get(page.gateway.url("/v1/runs"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    // A cookie whose signature does not match is nobody's.
    let forged = format!("{}0", cookie.trim_end_matches(|c: char| c.is_ascii_hexdigit()));
    let who = reqwest::Client::new()
        .get(page.gateway.url("/v1/session"))
        .header("cookie", &forged)
        .send()
        .await
        .unwrap();
    assert_eq!(who.status(), 401, "{forged}");
    // Nor can another site sign the page out.
    let out = reqwest::Client::new()
        .delete(page.gateway.url("/v1/session"))
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 403);
    let still = reqwest::Client::new()
        .get(page.gateway.url("/v1/session"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(still.status(), 200);
    // The page allows only its own scripts.
    let index = reqwest::get(page.gateway.url("/")).await.unwrap();
    let csp = index
        .headers()
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    // The bearer API is unchanged.
    assert_eq!(
        http(ALICE)
            .get(page.gateway.url("/v1/runs"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(page.console_errors().await, Vec::<String>::new());
    page.client.clone().close().await.unwrap();
}

/// Signs in over HTTP as the page does and returns the cookie.
async fn sign_in_cookie(gateway: &Gateway) -> String {
    let origin = format!("http://{}", gateway.addr);
    let answer = reqwest::Client::new()
        .post(gateway.url("/v1/session"))
        .header("origin", origin)
        .json(&json!({"token": ALICE}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let set = answer
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"), "{set}");
    set.split(';').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_gateway_restart_the_page_is_still_signed_in_and_rebuilds_the_run() {
    let mut page = page(&["--allow", "bash"]).await;
    page.sign_in(ALICE).await;
    page.start_run("before the restart steps=2 tool=bash").await;
    // The shell's streamed output sits in its call.
    page.until(
        "the shell output",
        "return (document.querySelector('#tree .call .output')?.innerText ?? '').includes('step 1');",
    )
    .await;
    page.until(
        "the end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    let turns = page.count("#tree .turn").await;
    let calls = page.count("#tree .call").await;
    let hash = page
        .client
        .current_url()
        .await
        .unwrap()
        .fragment()
        .unwrap_or_default()
        .to_string();

    // The same workspace and database, a new process (on a new port).
    assert!(page.gateway.terminate().success());
    let dir = page.gateway.dir.clone();
    page.gateway = Gateway::start(&dir, &[]);
    page.client
        .goto(&format!("{}#{hash}", page.gateway.url("/")))
        .await
        .unwrap();
    page.until("the signed-in page", "return !document.getElementById('app').hidden;")
        .await;
    page.until(
        "the rebuilt run",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    assert_eq!(page.count("#tree .turn").await, turns);
    assert_eq!(page.count("#tree .call").await, calls);
    assert!(page.text("#who").await.contains("alice"));

    // A second gateway on the same host (another workspace, another key):
    // signing in there leaves this page signed in, since browsers keep
    // cookies per host, not per port, and each key names its own cookie.
    let other_dir = tempfile::tempdir().unwrap();
    config(other_dir.path(), &page.model.url(), "");
    let other = Gateway::start(other_dir.path(), &[]);
    page.client.goto(&other.url("/")).await.unwrap();
    page.sign_in(ALICE).await;
    page.until(
        "the other signed-in page",
        "return !document.getElementById('app').hidden;",
    )
    .await;
    page.client.goto(&page.gateway.url("/")).await.unwrap();
    page.until(
        "the first page, still signed in",
        "return !document.getElementById('app').hidden;",
    )
    .await;
    assert!(page.text("#who").await.contains("alice"));
    drop(other);
    // In a narrow window the run view goes under the list.
    page.client.set_window_size(420, 900).await.unwrap();
    page.screenshot("narrow.png").await;
    assert_eq!(page.console_errors().await, Vec::<String>::new());
    page.client.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_tokens_answers_only_its_own_page_and_loopback_names() {
    let dir = tempfile::tempdir().unwrap();
    let model = PromptModel::start(PromptModelOptions::default());
    std::fs::write(
        dir.path().join("loom.toml"),
        format!("model = \"openai:fake\"\n[provider]\nbase_url = \"{}\"\n", model.url()),
    )
    .unwrap();
    let gateway = Gateway::start(dir.path(), &[]);
    let client = reqwest::Client::new();
    // Another site's page (a simple POST needs no preflight) is refused…
    let cross = client
        .post(gateway.url("/v1/runs"))
        .header("origin", "http://evil.example")
        .header("content-type", "text/plain")
        .body(r#"{"prompt":"from elsewhere"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    // …and so is a name rebound to 127.0.0.1.
    let rebound = client
        .get(gateway.url("/v1/runs"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);
    // A client that is not a browser, and the page itself, are welcome.
    let plain = client.get(gateway.url("/v1/runs")).send().await.unwrap();
    assert_eq!(plain.status(), 200);
    let own = client
        .post(gateway.url("/v1/runs"))
        .header("origin", format!("http://{}", gateway.addr))
        .json(&json!({"prompt": "from the page"}))
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 202);
    // Signing out a made-up cookie changes nothing and is not remembered.
    let genuine = sign_in_cookie(&gateway).await;
    let name = genuine.split('=').next().unwrap();
    assert!(name.starts_with("loom_session_"), "{genuine}");
    let out = client
        .delete(gateway.url("/v1/session"))
        .header("origin", format!("http://{}", gateway.addr))
        .header("cookie", format!("{name}=v1.6c6f63616c.99999999999.00"))
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 204);
}

/// A page of another origin on this host: `html` served from another port
/// of 127.0.0.1 (as `python3 -m http.server` would serve a file the agent
/// wrote), to every request, by a thread that lives as long as the test.
fn serve_elsewhere(html: String) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    format!("http://{addr}/hostile.html")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_from_another_local_port_cannot_use_the_session_over_websocket() {
    let page = page(&["--ask", "write_file"]).await;
    page.sign_in(ALICE).await;
    page.until("the signed-in page", "return !document.getElementById('app').hidden;")
        .await;
    // Browsers count every port of a host as one site: this page's
    // WebSocket to the gateway carries the SameSite=Strict cookie.
    let html = format!(
        r#"<!doctype html><title>waiting</title><script>
const log = [];
const done = () => {{ document.title = 'done ' + log.join(' | '); }};
const ws = new WebSocket('ws://{addr}/ws');
ws.onopen = () => {{
  log.push('open');
  ws.send(JSON.stringify({{type: 'request', id: '1', method: 'run.list', payload: {{}}}}));
  ws.send(JSON.stringify({{type: 'request', id: '2', method: 'agent.run', payload: {{prompt: 'hijacked steps=1 tool=write_file'}}}}));
}};
ws.onmessage = (m) => log.push('message ' + m.data.slice(0, 60));
ws.onerror = () => log.push('error');
ws.onclose = (e) => {{ log.push('close ' + e.code); done(); }};
setTimeout(done, 5000);
</script>"#,
        addr = page.gateway.addr
    );
    let hostile = serve_elsewhere(html);
    page.client.goto(&hostile).await.unwrap();
    page.until(
        "the hostile page's outcome",
        "return document.title.startsWith('done');",
    )
    .await;
    let outcome = page.client.title().await.unwrap();
    assert!(
        !outcome.contains("open"),
        "the hostile page got a connection: {outcome}"
    );
    assert!(!outcome.contains("message"), "the hostile page was answered: {outcome}");
    assert!(outcome.contains("error"), "{outcome}");
    // Nothing was started under alice's name.
    let runs: Value = http(ALICE)
        .get(page.gateway.url("/v1/runs"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 0, "{runs}");
    // The gateway's own page still works with the same cookie.
    page.client.goto(&page.gateway.url("/")).await.unwrap();
    page.until(
        "the signed-in page again",
        "return !document.getElementById('app').hidden;",
    )
    .await;
    page.client.clone().close().await.unwrap();
}

/// Rewind and fork from the page (docs/rewind.md): each step's files under
/// its turn with a diff on click, the Rewind button restoring step 1, the
/// Fork button opening the new session's run, and the links both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_each_steps_files_and_rewinds_and_forks_by_clicking() {
    let page = page(&["--allow", "write_file"]).await;
    let ws = page._dir.path().to_path_buf();
    page.sign_in(ALICE).await;
    page.until("the signed-in page", "return !document.getElementById('app').hidden;")
        .await;
    page.start_run("write two files steps=2 tool=write_file").await;
    page.until(
        "the end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    let original = page.text("#run-title").await.trim_start_matches("Run ").to_string();
    page.until(
        "the steps' files",
        "return document.querySelectorAll('#tree .files button.file').length === 2;",
    )
    .await;
    assert!(page.text("#tree").await.contains("step 2 changed: out_2.txt"));
    // A diff on click: the file is new at step 2.
    page.click("#tree .files button.file[data-path='out_2.txt']").await;
    page.until("the diff", "return !!document.querySelector('#tree pre.diff .add');")
        .await;
    assert_eq!(page.text("#tree pre.diff").await.trim(), "+ step 2");
    assert!(ws.join("out_2.txt").exists());

    // Rewind to step 1 (the select offers 0, 1 and 2; 2 is chosen).
    assert_eq!(page.count("#rewind-step option").await, 3);
    page.client
        .execute("document.getElementById('rewind-step').value = '1';", vec![])
        .await
        .unwrap();
    page.click("#rewind").await;
    page.until(
        "the rewind's note",
        "return document.getElementById('rewind-result').innerText.includes('rewound to step 1');",
    )
    .await;
    assert!(!ws.join("out_2.txt").exists());
    assert!(ws.join("out_1.txt").exists());
    page.until(
        "the rewind in the run's log",
        "return document.getElementById('run-links').innerText.includes('rewound to step 1');",
    )
    .await;

    // Fork from step 1 with a prompt: the page opens the new run, which
    // says where it came from; the original links to it.
    page.client
        .execute("document.getElementById('rewind-step').value = '1';", vec![])
        .await
        .unwrap();
    let prompt = page.client.find(Locator::Id("fork-prompt")).await.unwrap();
    prompt.send_keys("on a branch steps=0").await.unwrap();
    page.click("#fork").await;
    page.until(
        "the fork's run",
        &format!("return !document.getElementById('run-title').innerText.includes({original:?});"),
    )
    .await;
    page.until(
        "the fork's end",
        "return document.getElementById('run-status').innerText === 'DONE';",
    )
    .await;
    let forked = page.text("#run-title").await.trim_start_matches("Run ").to_string();
    // The prompt's run continues the fork's session, whose first run holds
    // the conversation: that one says where it came from.
    page.click("#run-table tbody tr:nth-child(2)").await;
    page.until(
        "the link back",
        "return document.getElementById('run-links').innerText.includes('forked from step 1 of run');",
    )
    .await;
    page.click("#run-links button.run-link").await;
    page.until(
        "the original again, linking to the fork",
        "return document.getElementById('run-links').innerText.includes('forked at step 1 into');",
    )
    .await;
    assert!(page.text("#run-title").await.contains(&original));
    assert_ne!(forked, original);
    page.screenshot("rewind-fork.png").await;
    assert_eq!(page.console_errors().await, Vec::<String>::new());
    page.client.clone().close().await.unwrap();
}
