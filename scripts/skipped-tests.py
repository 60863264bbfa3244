#!/usr/bin/env python3
"""Lists the tests that printed SKIPPED (a missing PostgreSQL, root, cgroup
controller...) from nextest's JUnit report, with the reason each gave, so a
run's summary says how many skipped and why, not only a line buried in one
test's output. Usage: skipped-tests.py [target/nextest/default/junit.xml]"""

import sys
import xml.etree.ElementTree as ET

path = sys.argv[1] if len(sys.argv) > 1 else "target/nextest/default/junit.xml"
try:
    tree = ET.parse(path)
except (OSError, ET.ParseError) as e:
    print(f"no JUnit report to read ({path}: {e})")
    sys.exit(0)
skipped = []
for case in tree.iter("testcase"):
    text = "\n".join(
        (node.text or "") for tag in ("system-out", "system-err") for node in case.iter(tag)
    )
    reasons = [line.strip() for line in text.splitlines() if "SKIPPED" in line]
    if reasons:
        skipped.append((f"{case.get('classname', '')} {case.get('name', '')}".strip(), reasons[0]))
if not skipped:
    print("no test printed SKIPPED")
else:
    print(f"{len(skipped)} test(s) printed SKIPPED:")
    for name, why in skipped:
        print(f"  {name}: {why[:300]}")
