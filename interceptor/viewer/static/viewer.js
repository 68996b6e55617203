// The run viewer's page: plain JavaScript over the JSON API next to it (relative URLs, so it works mounted anywhere).
"use strict";

const state = { sort: "started_at", order: "desc", offset: 0, limit: 50, total: 0, version: -1, rollout: null };
const $ = (selector) => document.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : typeof x === "number" ? +x.toFixed(digits) : x);
const time = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "–");

// ---- the run: cards and charts ----

function lineChart(target, series) {
  const box = $(target);
  box.replaceChildren();
  const all = series.flatMap((s) => s.points);
  if (!all.length) { box.append(el("div", { class: "empty" }, "nothing yet")); return; }
  const W = 400, H = 140, P = 28;
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const sx = (x) => P + ((x - x0) / (x1 - x0 || 1)) * (W - P - 6);
  const sy = (y) => H - 18 - ((y - y0) / (y1 - y0 || 1)) * (H - 28);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
  };
  add("line", { x1: P, y1: H - 18, x2: W - 6, y2: H - 18, stroke: "#cbd5e1" });
  add("text", { x: 2, y: 12, "font-size": 10, fill: "#6b7280" }, fmt(y1, 3));
  add("text", { x: 2, y: H - 18, "font-size": 10, fill: "#6b7280" }, fmt(y0, 3));
  add("text", { x: P, y: H - 4, "font-size": 10, fill: "#6b7280" }, fmt(x0, 1));
  add("text", { x: W - 40, y: H - 4, "font-size": 10, fill: "#6b7280" }, fmt(x1, 1));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    add("polyline", { fill: "none", stroke: s.color, "stroke-width": 1.6,
                      points: s.points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" ") });
    add("text", { x: W - 120, y: 12 + 11 * i, "font-size": 10, fill: s.color }, s.name);
  });
  box.append(svg);
}

function card(label, value, title) {
  return el("div", { class: "card", title }, el("b", {}, value), label);
}

function renderRun(run) {
  $("#files").textContent = run.files.join(", ") + (run.metrics_file ? ` · ${run.metrics_file}` : "");
  const status = Object.entries(run.by_status).map(([k, v]) => `${k} ${v}`).join(" · ") || "–";
  $("#summary").replaceChildren(
    card("rollouts", run.rollouts, status), card("by status", status),
    card("mean reward", fmt(run.mean_reward, 3), `${run.graded} graded`),
    card("failures", Object.values(run.failures_by_cause).reduce((a, b) => a + b, 0)),
    card("turns", run.turns), card("sampled tokens", run.sampled_tokens), card("forks", run.forks),
    card("auxiliary samples", run.auxiliary), card("training steps", run.steps),
  );
  const curve = (name) => run.curves[name] || [];
  lineChart("#chart-reward", [{ name: "reward", color: "#2563eb", points: curve("reward") }]);
  lineChart("#chart-stale", [
    { name: "staleness mean", color: "#9333ea", points: curve("sample/staleness_mean") },
    { name: "logprob gap mean", color: "#ea580c", points: curve("logprob_gap/mean") },
  ]);
  lineChart("#chart-rate", [
    { name: "turns/s", color: "#16a34a", points: run.rate.map((r) => [r.t, r.turns_per_s]) },
    { name: "sampled tok/s", color: "#0891b2", points: run.rate.map((r) => [r.t, r.sampled_tokens_per_s]) },
  ]);
  const causes = Object.entries(run.failures_by_cause).sort((a, b) => b[1] - a[1]);
  $("#failures").replaceChildren(causes.length
    ? el("table", {}, causes.map(([cause, n]) => el("tr", {}, el("td", {}, cause), el("td", {}, n))))
    : el("div", { class: "empty" }, "no failures"));
}

// ---- the table ----

function filterParams() {
  const params = new URLSearchParams();
  for (const field of $("#filters").elements) if (field.name && field.value !== "") params.set(field.name, field.value);
  params.set("sort", state.sort);
  params.set("order", state.order);
  params.set("offset", state.offset);
  params.set("limit", state.limit);
  return params;
}

function fillFacets(facets) {
  for (const [name, values] of Object.entries(facets)) {
    const select = $(`#filters select[name=${name}]`);
    const current = select.value;
    const known = new Set([...select.options].map((o) => o.value));
    for (const value of values) if (value !== "" && !known.has(value)) select.append(el("option", { value }, value));
    select.value = current;
  }
}

async function loadTable() {
  const data = await api("api/rollouts?" + filterParams());
  state.total = data.total;
  fillFacets(data.facets);
  $("#rollouts tbody").replaceChildren(...data.rows.map((row) => el("tr", { "data-key": row.key, onclick: () => openRollout(row.key) },
    el("td", {}, time(row.started_at)), el("td", {}, row.rollout_id), el("td", {}, row.task), el("td", {}, row.agent),
    el("td", { class: `status-${row.status}` }, row.status), el("td", {}, row.cause || "",
      row.tampered ? el("span", { class: "bad", title: "changes refused before grading" }, ` tampered ${row.tampered}`) : "",
      row.egress_refused ? el("span", { class: "bad", title: "connections its box's egress proxy refused" }, ` egress ${row.egress_refused}`) : ""),
    el("td", {}, fmt(row.reward, 3)),
    el("td", {}, row.turns), el("td", {}, row.completion_tokens), el("td", {}, row.prompt_tokens), el("td", {}, row.forks))));
  const last = Math.min(state.offset + state.limit, data.total);
  $("#page-info").textContent = data.total ? `${state.offset + 1}–${last} of ${data.total}` : "no rollouts match";
  $("#prev").disabled = state.offset === 0;
  $("#next").disabled = last >= data.total;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === state.sort);
    th.classList.toggle("asc", state.order === "asc");
  }
}

// ---- one rollout ----

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part.text ?? part.content ?? JSON.stringify(part)).join("\n");
  return JSON.stringify(content, null, 1);
}

function messageBox(message) {
  const role = message.role || "?";
  const parts = [el("div", { class: "role" }, el("b", {}, role), message.tool_call_id ? ` · result of ${message.tool_call_id}` : "")];
  const text = contentText(message.content);
  if (text.length > 800) {  // long system prompts and tool results fold, showing their start
    parts.push(el("details", {}, el("summary", {}, el("pre", { style: "display:inline" }, text.slice(0, 240) + ` … (${text.length} characters)`)),
      el("pre", {}, text)));
  } else if (text) {
    parts.push(el("pre", {}, text));
  }
  for (const call of message.tool_calls || []) {
    const fn = call.function || {};
    parts.push(el("pre", { class: "tool-call" }, `→ ${fn.name}(${fn.arguments})`));
  }
  return el("div", { class: `msg ${role}` }, parts);
}

function shade(logprob) {
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)} 70% ${Math.round(82 - 6 * p)}%)`;
}

function sampleBox(sample) {
  const head = `sample ${sample.index} · ${sample.length} tokens · ${sample.sampled_tokens} sampled · ${sample.turns} turns` +
    (sample.mean_logprob !== null ? ` · mean logprob ${fmt(sample.mean_logprob, 3)}` : "") +
    (sample.chain ? ` · ${sample.chain.kind}` : (sample.auxiliary ? " · auxiliary" : "")) +
    (sample.fork_reason ? ` · fork: ${sample.fork_reason}` : "");
  const body = el("div", { class: "tokens" });
  for (const span of sample.spans) {
    if (span.kind === "prompt") {
      body.append(el("div", { class: "span-prompt" + (span.text.length > 600 ? " long" : ""), title: `prompt tokens ${span.start}–${span.end} (mask 0)` }, span.text));
    } else {
      body.append(el("span", { class: "turn-mark" }, `turn ${span.turn} · tokens ${span.start}–${span.end} · ${span.finish_reason} · policy v${span.policy_version}` + (span.malformed_tool_call ? " · malformed tool call" : "") + (span.spans_sync ? " · spans a weight sync" : "")));
      for (const token of span.tokens) {
        if (!token.mask) {  // sampled in this chain's history, trained in an earlier sample: context here
          body.append(el("span", { class: "tok-ctx", "data-trained-in": span.trained_in ?? "",
            title: `id ${token.id} · context here: trained in sample ${span.trained_in ?? "?"}` }, token.text));
          continue;
        }
        body.append(el("span", { class: "tok", "data-logprob": token.logprob, style: `background:${shade(token.logprob)}`,
          title: `logprob ${token.logprob.toFixed(4)} · p ${Math.exp(token.logprob).toFixed(3)} · id ${token.id}` }, token.text));
      }
    }
  }
  return el("div", { class: "sample" + (sample.auxiliary ? " auxiliary" : ""), "data-sample": sample.index }, el("h2", {}, head), body);
}

const LINKS = { tool_call: "its tool call", history: "the history they share", summary: "the summary it resumes from",
                timing: "the chain answered last" };

// The rollout's chains as a tree: each under its parent, with its kind, the parent's turn it hangs from, how the
// parent was found, and its sampled tokens against those it trains (the rest are trained in an earlier sample).
function chainTree(nodes) {
  const children = new Map();
  for (const n of nodes) {
    const key = n.parent === null || n.parent === undefined ? "root" : n.parent;
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(n);
  }
  const item = (n) => {
    const from = n.parent === null || n.parent === undefined ? "the root" :
      `from sample ${n.parent}` + (n.parent_turn !== null && n.parent_turn !== undefined ? ` turn ${n.parent_turn}` : "") +
      (n.linked_by ? ` by ${LINKS[n.linked_by] || n.linked_by}` : "");
    const trained = n.trained === n.sampled ? `${n.sampled} sampled, all trained here` :
      `${n.sampled} sampled, ${n.trained} trained here, ${n.sampled - n.trained} trained in an ancestor`;
    const label = el("a", { href: `#sample-${n.sample}`, class: "chain", "data-sample": n.sample,
                            onclick: (e) => { e.preventDefault(); document.querySelector(`.sample[data-sample="${n.sample}"]`)?.scrollIntoView(); } },
      el("span", { class: `kind kind-${n.kind}` }, n.kind), ` sample ${n.sample} · ${from} · ${trained}` +
      (n.fork_reason && n.kind !== "main" ? ` · ${n.fork_reason}` : ""));
    const kids = children.get(n.sample) || [];
    return el("li", { "data-kind": n.kind, "data-parent": n.parent ?? "" }, label,
              kids.length ? el("ul", {}, kids.map(item)) : null);
  };
  return el("ul", { class: "tree" }, (children.get("root") || []).map(item));
}

function renderRollout(r) {
  const outcome = r.failure ? el("span", { class: "bad" }, `failed: ${r.failure.cause} · ${r.failure.message}`)
                            : `reward ${fmt(r.reward, 3)}`;
  $("#rollout-head").replaceChildren(...[
    el("h2", {}, `rollout ${r.rollout_id} · `, el("span", { class: `status-${r.status}` }, r.status), " · ", outcome),
    el("div", { class: "muted" }, `task ${r.metadata.task_id ?? "–"} · agent ${r.metadata.agent ?? "–"} · ${r.mode} · ` +
      `answer ${JSON.stringify(r.answer)} · ${r.usage ? `${r.usage.turns} turns, ${r.usage.prompt_tokens} prompt + ${r.usage.completion_tokens} sampled tokens` : ""}`),
    r.tokenizer_note ? el("div", { class: "muted" }, r.tokenizer_note) : null,
    ...r.events.filter((e) => e.kind === "tampering").map((e) => el("div", { class: "bad tampering" },
      `tampering: ${e.total} changes refused before grading (` +
      Object.entries(e.counts).map(([kind, n]) => `${kind} ${n}`).join(", ") + "): " +
      e.refused.map((c) => `${c.change} ${c.path}`).join(", "))),
    ...r.events.filter((e) => e.kind === "egress_refused").map((e) => el("div", { class: "bad egress" },
      `egress refused: ${e.host}:${e.port} (${e.reason})`)),
    el("details", {}, el("summary", {}, `events (${r.events.length})`),
      el("pre", {}, r.events.map((e) => JSON.stringify(e)).join("\n")))].filter(Boolean));
  const messages = [];
  r.trace.forEach((call, i) => {
    messages.push(el("div", { class: "turn-mark" }, `chat call ${i + 1}` + (call.finish_reason ? ` · ${call.finish_reason}` : "")));
    for (const m of call.new_messages || []) messages.push(messageBox(m));
    if (call.response) messages.push(messageBox(call.response));
  });
  $("#messages").replaceChildren(...messages);
  $("#fork-tree").replaceChildren(chainTree(r.tree));
  $("#sample-list").replaceChildren(...r.samples.map(sampleBox));
  // a long prompt span shows its end: the part nearest the tokens sampled after it
  for (const span of document.querySelectorAll("#sample-list .span-prompt.long")) span.scrollTop = span.scrollHeight;
}

async function openRollout(key) {
  if (location.hash !== `#rollout=${key}`) { location.hash = `rollout=${key}`; return; }
  state.rollout = key;
  $("#run-view").hidden = true;
  $("#rollout-view").hidden = false;
  renderRollout(await api(`api/rollouts/${encodeURIComponent(key)}`));
}

function route() {
  const match = location.hash.match(/^#rollout=(.+)$/);
  if (match) { openRollout(decodeURIComponent(match[1])); return; }
  state.rollout = null;
  $("#rollout-view").hidden = true;
  $("#run-view").hidden = false;
}

// ---- live ----

async function refresh() {
  const run = await api("api/run");
  renderRun(run);
  await loadTable();
  document.body.dataset.version = run.version;
  document.body.dataset.rollouts = run.rollouts;
}

function follow() {
  const source = new EventSource("api/events");
  source.onmessage = (event) => {
    const update = JSON.parse(event.data);
    $("#live").classList.remove("off");
    if (update.version !== state.version) { state.version = update.version; refresh(); }
  };
  source.onerror = () => $("#live").classList.add("off");
}

$("#filters").addEventListener("input", () => { state.offset = 0; loadTable(); });
$("#prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadTable(); });
$("#next").addEventListener("click", () => { state.offset += state.limit; loadTable(); });
$("#back").addEventListener("click", (event) => { event.preventDefault(); location.hash = ""; });
for (const th of document.querySelectorAll("th[data-sort]")) {
  th.addEventListener("click", () => {
    state.order = state.sort === th.dataset.sort && state.order === "desc" ? "asc" : "desc";
    state.sort = th.dataset.sort;
    state.offset = 0;
    loadTable();
  });
}
window.addEventListener("hashchange", route);
route();
refresh().then(follow);
