"""Serve the stored rates over HTTP."""

import json
from datetime import datetime

from flask import Flask, jsonify

app = Flask(__name__)


@app.route("/rates")
def rates():
    with open("data/rates.json") as f:
        data = json.load(f)
    data["served_at"] = datetime.utcnow().isoformat()
    return jsonify(data)
