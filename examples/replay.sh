#!/bin/sh
# Replay a session through several strategies side by side: the built-in demo session
# here (offline); your own with `agentcompact replay ~/.claude/projects --report replay.html`.
set -e
agentcompact demo --save demo.json > /dev/null
agentcompact replay demo.json --strategy none,window,cliff --trigger 60000 \
    --report replay.html --json replay.json
