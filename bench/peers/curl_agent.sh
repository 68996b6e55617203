#!/bin/sh
# A command agent of a few shell lines (curl and jq): TURNS chat turns, each resending the conversation with the
# reply and a new user message appended, then `answer done`. Light enough to run a thousand at once.
turns=${1:-4}
task=$(cat)
msgs=$(jq -cn --arg t "$task" '[{role:"user",content:$t}]')
i=0
while [ "$i" -lt "$turns" ]; do
  body=$(jq -cn --argjson m "$msgs" '{model:"policy",messages:$m,max_tokens:16}')
  reply=$(curl -sf -H "Authorization: Bearer $OPENAI_API_KEY" -H "Content-Type: application/json" -d "$body" \
    "$OPENAI_BASE_URL/chat/completions") || exit 1
  content=$(printf '%s' "$reply" | jq -r '.choices[0].message.content // ""')
  msgs=$(jq -cn --argjson m "$msgs" --arg c "$content" --arg u "result $i" \
    '$m + [{role:"assistant",content:$c},{role:"user",content:$u}]')
  i=$((i + 1))
done
answer done
