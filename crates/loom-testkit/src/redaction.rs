//! A corpus of text that tool output may carry: secrets people leak (each
//! must vanish, the text around it stay) and look-alikes that are not
//! secrets (each must stay exactly as it is). Used by the tests that check
//! what reaches the events and the provider.

/// One case of the corpus.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// What it is.
    pub name: &'static str,
    /// The text, as a file or a command would show it.
    pub text: &'static str,
    /// The part that must not survive; `None` for text that must stay whole.
    pub secret: Option<&'static str>,
    /// A part that must survive (the name of what was redacted, say).
    pub kept: &'static str,
}

const fn secret(name: &'static str, text: &'static str, secret: &'static str, kept: &'static str) -> Case {
    Case {
        name,
        text,
        secret: Some(secret),
        kept,
    }
}

const fn plain(name: &'static str, text: &'static str) -> Case {
    Case {
        name,
        text,
        secret: None,
        kept: text,
    }
}

/// The corpus: secrets first, then text that must stay untouched.
pub const CORPUS: &[Case] = &[
    secret(
        "openai project key",
        "using key sk-proj-4fG7hJ9kL2mN5pQ8rS1tU4vW7xY0zA3bC6dE9fG for the batch",
        "sk-proj-4fG7hJ9kL2mN5pQ8rS1tU4vW7xY0zA3bC6dE9fG",
        "for the batch",
    ),
    secret(
        "anthropic key",
        "ANTHROPIC key: sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Jh1Gf0EdCbA-xyz",
        "sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Jh1Gf0EdCbA-xyz",
        "ANTHROPIC key:",
    ),
    secret(
        "github classic token",
        "remote uses ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "remote uses",
    ),
    secret(
        "github fine-grained token",
        "token github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF0123 expires soon",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF0123",
        "expires soon",
    ),
    secret(
        "gitlab token",
        "CI token glpat-x8Yz3Qw9Er7Ty1Ui5Op2 in the log",
        "glpat-x8Yz3Qw9Er7Ty1Ui5Op2",
        "in the log",
    ),
    secret(
        "npm token",
        "//registry.npmjs.org/:_authToken=npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        "npm_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        "registry.npmjs.org",
    ),
    secret(
        "hugging face token",
        "HF hub login with hf_QwErTyUiOpAsDfGhJkLzXcVbNm1234567890 succeeded",
        "hf_QwErTyUiOpAsDfGhJkLzXcVbNm1234567890",
        "succeeded",
    ),
    secret(
        "aws access key id",
        "caller AKIAIOSFODNN7EXAMPLE assumed the role",
        "AKIAIOSFODNN7EXAMPLE",
        "assumed the role",
    ),
    secret(
        "aws secret in credentials file",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "aws_secret_access_key",
    ),
    secret(
        "aws secret in env",
        "AWS_SECRET_ACCESS_KEY=Zq8vT2nR5yX1wK7mP4sL9dF3gH6jB0cN2eA8uI5o",
        "Zq8vT2nR5yX1wK7mP4sL9dF3gH6jB0cN2eA8uI5o",
        "AWS_SECRET_ACCESS_KEY",
    ),
    secret(
        "aws secret in sts json",
        r#"{"AccessKeyId": "ASIAY34FZKBOKMUTVV7A", "SecretAccessKey": "9drTJvcXLB89EXAMPLELB8923FB892xMFI", "Expiration": "2026-11-23T12:00:00Z"}"#,
        "9drTJvcXLB89EXAMPLELB8923FB892xMFI",
        "SecretAccessKey",
    ),
    secret(
        "aws session token in json",
        r#"  "SessionToken": "IQoJb3JpZ2luX2VjEXAMPLEc2Vzc2lvbi10b2tlbi1ib2R5Ly9hYmM=","#,
        "IQoJb3JpZ2luX2VjEXAMPLEc2Vzc2lvbi10b2tlbi1ib2R5Ly9hYmM=",
        "SessionToken",
    ),
    secret(
        "stripe live secret key",
        "Stripe.api_key = 'sk_live_51H8xYzAbCdEfGhIjKlMnOpQr'",
        "sk_live_51H8xYzAbCdEfGhIjKlMnOpQr",
        "Stripe.api_key",
    ),
    secret(
        "stripe restricted key",
        "restricted: rk_live_51H8xRestrictedKey0123456789",
        "rk_live_51H8xRestrictedKey0123456789",
        "restricted:",
    ),
    secret(
        "stripe webhook secret",
        "endpoint secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "endpoint secret",
    ),
    secret(
        "slack bot token",
        "bot connected with xoxb-2048-1024-AbCdEfGhIjKlMnOp",
        "xoxb-2048-1024-AbCdEfGhIjKlMnOp",
        "bot connected with",
    ),
    secret(
        "slack webhook url",
        "notify https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX on failure",
        "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
        "on failure",
    ),
    secret(
        "google api key",
        "maps key AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI loaded",
        "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI",
        "loaded",
    ),
    secret(
        "bare jwt",
        "session eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U valid",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "valid",
    ),
    secret(
        "bearer header",
        "Authorization: Bearer 7f3a9c2e1b5d8f4a6c0e",
        "7f3a9c2e1b5d8f4a6c0e",
        "Authorization: Bearer",
    ),
    secret(
        "basic auth header",
        "Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==",
        "dXNlcjpwYXNzd29yZDEyMw==",
        "Authorization: Basic",
    ),
    secret(
        "postgres url",
        "DATABASE_URL=postgres://app:s3cretPa55@db.internal:5432/prod",
        "s3cretPa55",
        "@db.internal:5432/prod",
    ),
    secret(
        "mysql url",
        "connecting to mysql://root:toor-pass-99@localhost/shop",
        "toor-pass-99",
        "mysql://root:",
    ),
    secret(
        "redis url without user",
        "cache at redis://:r3d1s-pass@cache:6379/0",
        "r3d1s-pass",
        "@cache:6379/0",
    ),
    secret(
        "mongodb srv url",
        "uri: mongodb+srv://admin:M0ngoPass42@cluster0.example.net/test",
        "M0ngoPass42",
        "cluster0.example.net",
    ),
    secret("env password", "DB_PASSWORD=hunter2", "hunter2", "DB_PASSWORD="),
    secret(
        "exported token in quotes",
        "export API_TOKEN=\"tok-7f3a9c2e1b\"",
        "tok-7f3a9c2e1b",
        "export API_TOKEN=",
    ),
    secret(
        "yaml password",
        "database:\n  password: correct-horse-battery\n  host: db",
        "correct-horse-battery",
        "host: db",
    ),
    secret(
        "compose environment list",
        "    environment:\n      - POSTGRES_PASSWORD=pg-pass-2024",
        "pg-pass-2024",
        "POSTGRES_PASSWORD",
    ),
    secret("ini password", "[db]\npassword = ini-secret-1\nport = 5432", "ini-secret-1", "port = 5432"),
    secret(
        "toml api key",
        "api_key = \"toml-key-8a7b6c5d4e\"",
        "toml-key-8a7b6c5d4e",
        "api_key",
    ),
    secret(
        "json password",
        r#"{"user": "admin", "password": "json-pw-123"}"#,
        "json-pw-123",
        r#""user": "admin""#,
    ),
    secret(
        "json camelCase api key",
        r#"{"apiKey": "AK-9921-xyz-prod"}"#,
        "AK-9921-xyz-prod",
        "apiKey",
    ),
    secret(
        "json client secret",
        r#""client_secret": "cs_9f8e7d6c5b4a3","#,
        "cs_9f8e7d6c5b4a3",
        "client_secret",
    ),
    secret(
        "env secret",
        "JWT_SECRET=my-jwt-signing-secret",
        "my-jwt-signing-secret",
        "JWT_SECRET",
    ),
    secret(
        "env key",
        "ENCRYPTION_KEY=4f9a8b7c6d5e4f3a2b1c",
        "4f9a8b7c6d5e4f3a2b1c",
        "ENCRYPTION_KEY",
    ),
    secret("env pwd", "DB_PWD=pw-local-77", "pw-local-77", "DB_PWD"),
    secret(
        "pem private key",
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
        "",
    ),
    secret("env pass", "SMTP_PASS=dbpassvalue77", "dbpassvalue77", "SMTP_PASS="),
    secret(
        "rails secret key base",
        "SECRET_KEY_BASE=0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef0123456789abcdef",
        "SECRET_KEY_BASE",
    ),
    secret(
        "password in a url query",
        "GET https://example.com/login?user=bob&password=querysecret55 HTTP/1.1",
        "querysecret55",
        "user=bob&password=",
    ),
    secret(
        "presigned url signature",
        "https://bucket.s3.amazonaws.com/f.zip?X-Amz-Expires=300&X-Amz-Signature=4a8b2c6d0e1f3a5b7c9d",
        "4a8b2c6d0e1f3a5b7c9d",
        "X-Amz-Expires=300",
    ),
    secret(
        "oauth access token in a query",
        "callback?state=xyz&access_token=ya29.a0AfH6SMBx3yZ&expires_in=3599",
        "ya29.a0AfH6SMBx3yZ",
        "expires_in=3599",
    ),
    secret(
        "xml password",
        "<datasource><user>app</user><password>xmlsecret999</password></datasource>",
        "xmlsecret999",
        "<user>app</user>",
    ),
    // Not secrets: each must stay exactly as it is.
    plain(
        "lockfile integrity",
        r#""integrity": "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUR8Rw==""#,
    ),
    plain(
        "cargo lock checksum",
        "checksum = \"a1f8c8e3b9b7e5e9c8a6f2f6d3c3b7e2a9c3f1e0d2b4a6c8e0f2a4c6e8a0b2c4\"",
    ),
    plain(
        "yarn resolved url",
        "resolved \"https://registry.yarnpkg.com/lodash/-/lodash-4.17.21.tgz#679591c564c3bffaae8454cf0b3df370c3d6911c\"",
    ),
    plain("uuid", "run 3f2b8c1e-9d4a-4e6f-8b2c-1a3d5e7f9b0c finished"),
    plain("git sha", "commit 9fceb02d0ae598e95dc970b74767f19372d61af8"),
    plain("rust token code", "    let token = lexer.next_token();"),
    plain("python password prompt", "    password = getpass.getpass(\"Password: \")"),
    plain("accessor code", "    fn api_key(&self) -> &str { &self.api_key }"),
    plain("attribute copy", "    password = args.password"),
    plain("yaml placeholder", "password: ${DB_PASSWORD}"),
    plain("token limit", "max_tokens = 4096"),
    plain("primary key", "primary_key: id"),
    plain("sort key", "sort_key: created_at"),
    plain("token count", "token_count: 1234"),
    plain("url with user only", "git clone https://deploy@example.com/team/repo.git"),
    plain("url with port", "health at https://example.com:8443/status?verbose=1"),
    plain("prose", "Rotate the API key and the bearer token every 90 days."),
    plain("working directory", "PWD=/home/dev/project"),
    plain(
        "image data url",
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    ),
    plain(
        "ssh public key",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl dev@laptop",
    ),
    plain("json schema key", r#"{"key": "display_name", "type": "string"}"#),
    plain("kubernetes secret name", "secret_name: my-app-tls"),
    plain("commit message", "fix: refresh the token before it expires (#1234)"),
    plain("boolean setting", "verify_token: true"),
    plain(
        "ordinary query string",
        "https://api.example.com/items?page=2&sort=name&token_type=bearer",
    ),
    plain("xml key element", "<key>display_name</key>"),
    plain("bypass flag", "BYPASS=1"),
    plain("rust field", "    password: String,"),
    plain("typescript field", "  password: string;"),
    plain("python annotation", "    secret: str"),
    plain("graphql field", "  password: String!"),
    plain("go short assignment", "    password := r.FormValue(\"p\")"),
    plain("openapi bearer scheme", "      scheme: bearer\n      bearerFormat: JWT"),
    plain("bearer in prose", "Bearer authentication is required for every route."),
    plain("basic in prose", "It provides basic functionality here."),
    plain("word with sk-", "disk-usage-monitor-service is running"),
];
