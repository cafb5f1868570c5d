"""Start the shopfront web server with the settings from deploy/web.toml."""

import tomllib

DEFAULT_PORT = 8000


def load_settings(path="deploy/web.toml"):
    with open(path, "rb") as f:
        return tomllib.load(f)


def main():
    settings = load_settings()
    port = settings.get("web", {}).get("port", DEFAULT_PORT)
    print(f"would listen on {port}")


if __name__ == "__main__":
    main()
