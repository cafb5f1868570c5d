"""Settings of the report mailer. Read once at start; restart to apply changes."""

import os

# Where reports are read from and written to.
DATA_DIR = os.environ.get("MAILER_DATA_DIR", "/var/lib/mailer")
OUTPUT_DIR = os.path.join(DATA_DIR, "out")
ARCHIVE_DIR = os.path.join(DATA_DIR, "archive")

# The SMTP server that sends the reports.
SMTP_HOST = os.environ.get("MAILER_SMTP_HOST", "localhost")
SMTP_PORT = 587
SMTP_USE_TLS = True
SMTP_USER = os.environ.get("MAILER_SMTP_USER", "")

# Who gets what.
SENDER = "reports@example.com"
DAILY_RECIPIENTS = ["ops@example.com"]
WEEKLY_RECIPIENTS = ["ops@example.com", "finance@example.com"]
ERROR_RECIPIENTS = ["oncall@example.com"]

# Network behaviour.
CONNECT_RETRIES = 3
RETRY_DELAY_SECONDS = 10
TIMEOUT_SECONDS = 30
MAX_ATTACHMENT_MB = 15

# Scheduling (24-hour clock, server time).
DAILY_SEND_HOUR = 7
WEEKLY_SEND_DAY = "monday"
WEEKLY_SEND_HOUR = 8

# Formatting.
DATE_FORMAT = "%Y-%m-%d"
CURRENCY = "EUR"
DECIMAL_PLACES = 2
INCLUDE_CHARTS = True
CHART_WIDTH_PX = 800
CHART_HEIGHT_PX = 400

# Housekeeping.
KEEP_ARCHIVES_DAYS = 90
LOG_LEVEL = os.environ.get("MAILER_LOG_LEVEL", "INFO")
LOG_FILE = os.path.join(DATA_DIR, "mailer.log")


def summary():
    """One line describing the settings, for the start-up log."""
    return (f"smtp={SMTP_HOST}:{SMTP_PORT} tls={SMTP_USE_TLS} "
            f"timeout={TIMEOUT_SECONDS}s retries={CONNECT_RETRIES}")
