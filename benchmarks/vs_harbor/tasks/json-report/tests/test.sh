#!/bin/bash
python3 - <<'PY'
import json
try:
    report = json.load(open('/app/report.json'))
    parsed = 1.0
except Exception:
    report, parsed = {}, 0.0
status = 1.0 if report.get('status') == 'ok' else 0.0
count = 1.0 if report.get('count') == 3 else 0.0
json.dump({'reward': parsed * status * count, 'parsed': parsed, 'status': status, 'count': count}, open('/logs/verifier/reward.json', 'w'))
PY
