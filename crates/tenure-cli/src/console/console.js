// tenure console: follows /api/events and draws the store's names. Every
// text from the store goes through textContent (never HTML), so a label
// like <img src=x onerror=...> shows as text.
"use strict";

window.tenureErrors = [];
window.addEventListener("error", (e) => window.tenureErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.tenureErrors.push(String(e.reason)));

const state = {
  admin: false,
  snapshot: null,
  receivedAt: 0,
  selected: null,
  // The longest lease left seen per session: the page's estimate of its TTL.
  ttlSeen: new Map(),
  // Per name, the holders last seen, for the timeline.
  lastHolders: new Map(),
  timeline: new Map(),
};

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function duration(ms) {
  if (ms < 0) ms = 0;
  if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
  const s = Math.round(ms / 1000);
  if (s < 120) return s + " s";
  const m = Math.floor(s / 60);
  if (m < 120) return m + " min " + (s % 60) + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

// What an entry is called in a name of `kind` (the server says what each
// name is: lock, read/write lock, semaphore, election, tick claim,
// non-fair waiters (a lock's wake-up line), group (its members) or shard).
function role(kind, entry) {
  const granted = entry.state === "holder";
  if (kind === "election") return granted ? "leader" : "candidate";
  if (kind === "group") return "member";
  if (kind === "shard") return granted ? "owner" : "next owner";
  if (kind === "tick claim") return "claimed";
  if (kind === "non-fair waiters") return granted ? "watching" : "waiting";
  return granted ? "holder" : "waiter";
}

function leaseLeft(entry) {
  return entry.ttl_left_ms - (Date.now() - state.receivedAt);
}

function leaseCell(entry) {
  if (entry.ttl_left_ms === null) {
    const unknown = el("span", "not told", "lease");
    unknown.title = "This store does not tell a client how long a session has left";
    return unknown;
  }
  const span = el("span", "", "lease");
  span.dataset.session = entry.session;
  span.dataset.ttlLeft = String(entry.ttl_left_ms);
  paintLease(span);
  return span;
}

function paintLease(span) {
  const ttl = state.ttlSeen.get(span.dataset.session) || 1;
  const left = Number(span.dataset.ttlLeft) - (Date.now() - state.receivedAt);
  const fraction = left / ttl;
  span.textContent = duration(left);
  span.classList.remove("ok", "amber", "red");
  span.classList.add(fraction > 0.5 ? "ok" : fraction > 0.25 ? "amber" : "red");
}

function note(name, text) {
  if (!state.timeline.has(name)) state.timeline.set(name, []);
  const list = state.timeline.get(name);
  list.push(clock(new Date()) + "  " + text);
  if (list.length > 200) list.shift();
}

function followTimeline(names) {
  const now = new Map();
  for (const n of names) {
    const holders = n.entries.filter((e) => e.state === "holder");
    now.set(n.name, holders);
    const before = state.lastHolders.get(n.name) || [];
    for (const h of holders) {
      if (!before.some((b) => b.token === h.token)) note(n.name, "granted token " + h.token + " to " + h.label);
    }
    for (const b of before) {
      if (!holders.some((h) => h.token === b.token)) note(n.name, "token " + b.token + " released or expired");
    }
  }
  for (const [name, before] of state.lastHolders) {
    if (!now.has(name)) for (const b of before) note(name, "token " + b.token + " released or expired");
  }
  state.lastHolders = now;
}

function render() {
  const snap = state.snapshot;
  if (!snap) return;
  $("store").textContent = snap.store;
  $("updated").textContent = "read " + clock(new Date(Number(snap.at_ms)));
  const err = $("store-error");
  err.hidden = !snap.error;
  err.textContent = snap.error ? "The store did not answer: " + snap.error : "";
  const names = Array.isArray(snap.names) ? snap.names : [];
  for (const n of names) {
    for (const e of n.entries) {
      const seen = state.ttlSeen.get(e.session) || 0;
      if (e.ttl_left_ms > seen) state.ttlSeen.set(e.session, e.ttl_left_ms);
    }
  }
  followTimeline(names);
  // Forget sessions that are gone (their TTL estimate, too).
  const live = new Set(names.flatMap((n) => n.entries.map((e) => e.session)));
  for (const session of [...state.ttlSeen.keys()]) if (!live.has(session)) state.ttlSeen.delete(session);

  const body = $("names").tBodies[0];
  body.replaceChildren();
  // Until the first reading the page says so, not that the store is empty.
  $("empty").textContent = "No name has a holder or a waiter.";
  $("empty").hidden = names.length > 0;
  $("actions-head").hidden = !state.admin;
  for (const n of names) {
    const holders = n.entries.filter((e) => e.state === "holder");
    const waiters = n.entries.filter((e) => e.state === "waiter");
    const kind = n.kind || "lock";
    const tr = el("tr", undefined, "name-row");
    tr.dataset.name = n.name;
    if (state.selected === n.name) tr.classList.add("selected");
    tr.addEventListener("click", () => { state.selected = n.name; render(); });
    tr.append(el("td", n.name, "mono name"), el("td", kind, "kind"));
    const holderCell = el("td", undefined, "holder");
    holderCell.textContent = holders.map((h) => h.label + " · " + h.session).join(", ") || "–";
    tr.append(holderCell);
    tr.append(el("td", holders.map((h) => h.token).join(", ") || "–", "mono token"));
    const leaseTd = el("td");
    for (const h of holders) leaseTd.append(leaseCell(h), " ");
    tr.append(leaseTd);
    tr.append(el("td", String(waiters.length), "waiters"));
    const oldest = waiters.reduce((m, w) => Math.max(m, w.waiting_ms || 0), 0);
    tr.append(el("td", waiters.length ? duration(oldest) : "–"));
    tr.append(el("td", holders.map((h) => h.value).filter((v) => v).join(", ") || "", "mono value"));
    if (state.admin) {
      const td = el("td");
      if (holders.length) {
        const action = kind === "election" ? "step-down" : "release";
        const b = el("button", action === "step-down" ? "Make leader step down…" : "Force release…", "danger action");
        b.addEventListener("click", (ev) => { ev.stopPropagation(); openDialog(n.name, action); });
        td.append(b);
      }
      tr.append(td);
    }
    body.append(tr);
  }

  const detail = $("detail");
  const chosen = names.find((n) => n.name === state.selected);
  detail.hidden = !chosen && !state.timeline.has(state.selected);
  if (state.selected) {
    $("detail-name").textContent = state.selected;
    const qb = $("queue").tBodies[0];
    qb.replaceChildren();
    (chosen ? chosen.entries : []).forEach((e, i) => {
      const tr = el("tr");
      tr.append(el("td", String(i + 1)), el("td", role(chosen.kind, e)), el("td", e.token, "mono"),
        el("td", e.mode), el("td", e.label), el("td", e.session, "mono"),
        el("td", String(e.holds)));
      const td = el("td");
      td.append(leaseCell(e));
      tr.append(td, el("td", e.value, "mono"));
      qb.append(tr);
    });
    const tl = $("timeline");
    tl.replaceChildren(...(state.timeline.get(state.selected) || []).map((t) => el("li", t)));
  }

  // Sessions grouped by label (host:pid by default).
  const groups = new Map();
  for (const n of names) {
    for (const e of n.entries) {
      if (!groups.has(e.label)) groups.set(e.label, new Map());
      const sessions = groups.get(e.label);
      if (!sessions.has(e.session)) sessions.set(e.session, []);
      sessions.get(e.session).push((e.state === "holder" ? "holds " : "waits for ") + n.name);
    }
  }
  const ul = $("sessions");
  ul.replaceChildren();
  for (const [label, sessions] of groups) {
    const li = el("li");
    li.append(el("strong", label));
    const inner = el("ul");
    for (const [session, what] of sessions) {
      const item = el("li", session + ": " + what.join(", "), "mono session");
      item.dataset.session = session;
      if (state.admin) {
        const b = el("button", "End session…", "danger action");
        b.addEventListener("click", () => openDialog(session, "end-session"));
        item.append(" ", b);
      }
      inner.append(item);
    }
    li.append(inner);
    ul.append(li);
  }
  if (groups.size === 0) ul.append(el("li", "No sessions hold or wait for anything.", "muted"));
  renderSchedules(Array.isArray(snap.schedules) ? snap.schedules : []);
  renderBuilds(snap.builds);
}

// Which builds and formats the store's live sessions speak (a session of
// tenure 0.1.0 records none).
function renderBuilds(builds) {
  const ul = $("builds");
  ul.replaceChildren();
  if (!builds || !Array.isArray(builds.builds)) {
    ul.append(el("li", "This store does not list its sessions' builds.", "muted"));
    return;
  }
  for (const b of builds.builds) {
    const which = b.release ? "tenure " + b.release + " (format " + b.format + ")" : "no build recorded (tenure 0.1.0)";
    const n = Array.isArray(b.sessions) ? b.sessions.length : 0;
    ul.append(el("li", which + ": " + n + " session" + (n === 1 ? "" : "s"), "build"));
  }
  if (builds.builds.length === 0) ul.append(el("li", "No live session.", "muted"));
}

// A time with its zone: in `zone` (a schedule's own) when given and
// known to the browser, else in the browser's.
const WHEN = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" };

function when(rfc3339, zone) {
  if (!rfc3339) return "–";
  const d = new Date(rfc3339);
  if (isNaN(d)) return String(rfc3339);
  try {
    return d.toLocaleString(undefined, zone ? { ...WHEN, timeZone: zone } : WHEN);
  } catch (e) {
    return d.toLocaleString(undefined, WHEN);
  }
}

function clock(date) {
  return date.toLocaleTimeString(undefined, { timeZoneName: "short" });
}

function renderSchedules(schedules) {
  const body = $("schedules").tBodies[0];
  body.replaceChildren();
  $("no-schedules").textContent = "No schedule has run on this store.";
  $("no-schedules").hidden = schedules.length > 0;
  $("schedule-actions-head").hidden = !state.admin;
  for (const s of schedules) {
    const tr = el("tr", undefined, "schedule-row");
    tr.dataset.job = s.job;
    tr.append(el("td", s.job, "mono name"), el("td", s.expr + " (" + s.time_zone + ")", "mono"),
      el("td", s.mode + ", missed: " + s.missed));
    const p = s.paused;
    const next = (s.next_ticks || []).map((t) => when(t, s.time_zone)).join(", ");
    tr.append(el("td", next || (p ? "none until resumed" : "–"), "next-ticks"));
    const r = s.last_run;
    // A failed run stands out, with its exit code (in its outcome).
    const failed = r && r.result === "failed";
    tr.append(el("td", r ? (failed ? "FAILED · " : "") + when(r.tick, s.time_zone) + " by " + r.by + " · token " +
      r.token + " · " + r.outcome + " in " + Number(r.seconds).toFixed(3) + " s" : "never",
      failed ? "last-run failed" : "last-run"));
    const run = s.running;
    const running = run ? "running tick " + when(run.tick, s.time_zone) + " on " + run.by +
      (run.since ? " since " + when(run.since, s.time_zone) : "") : "";
    const stateTd = p
      ? el("td", "paused" + (p.until ? " until " + when(p.until, s.time_zone) : "") + " by " + p.by + ": " + p.reason +
        (run ? " · " + running : ""), "paused")
      : el("td", run ? running : "idle", run ? "running" : "active");
    tr.append(stateTd);
    if (state.admin) {
      const td = el("td");
      const b = p ? el("button", "Resume…", "action") : el("button", "Pause…", "danger action");
      b.addEventListener("click", () => openDialog(s.job, p ? "resume" : "pause"));
      td.append(b);
      tr.append(td);
    }
    body.append(tr);
  }
}

function tick() {
  for (const span of document.querySelectorAll(".lease[data-session]")) paintLease(span);
}

function connect() {
  const source = new EventSource("/api/events");
  const badge = $("badge");
  source.addEventListener("open", () => { badge.textContent = "live"; badge.className = "badge live"; });
  source.addEventListener("snapshot", (ev) => {
    state.snapshot = JSON.parse(ev.data);
    state.receivedAt = Date.now();
    badge.textContent = "live";
    badge.className = "badge live";
    render();
  });
  source.addEventListener("error", () => {
    badge.textContent = "reconnecting";
    badge.className = "badge reconnecting";
  });
}

let dialogFor = null;

// Per action: the dialog's title, button, what is typed again, and whether
// the fencing warning applies (it does whenever a lease is taken away).
const ACTIONS = {
  "release": { title: (n) => "Force release " + n, go: "Release", confirm: "Type the name again", fencing: true },
  "step-down": { title: (n) => "Make the leader of " + n + " step down", go: "Step down", confirm: "Type the name again", fencing: true },
  "end-session": { title: (n) => "End session " + n + " (everything it holds or waits for)", go: "End session", confirm: "Type the session again", fencing: true },
  "pause": { title: (n) => "Pause schedule " + n + " on every instance", go: "Pause", confirm: "Type the job again", fencing: false },
  "resume": { title: (n) => "Resume schedule " + n, go: "Resume", confirm: "Type the job again", fencing: false },
};

function openDialog(name, action) {
  dialogFor = { name, action };
  const a = ACTIONS[action];
  $("dialog-title").textContent = a.title(name);
  $("dialog-go").textContent = a.go;
  $("dialog-confirm-label").textContent = a.confirm;
  $("dialog-warning").hidden = !a.fencing;
  $("dialog-for-label").hidden = action !== "pause";
  $("dialog-for").value = "";
  $("dialog-confirm").value = "";
  $("dialog-reason").value = "";
  $("dialog-error").hidden = true;
  $("dialog").hidden = false;
  $("dialog-confirm").focus();
}

async function submitDialog(ev) {
  ev.preventDefault();
  if (!dialogFor) return;
  const error = $("dialog-error");
  const body = {
    name: dialogFor.name,
    confirm: $("dialog-confirm").value,
    reason: $("dialog-reason").value,
    action: dialogFor.action,
  };
  const minutes = Number($("dialog-for").value);
  if (dialogFor.action === "pause" && minutes > 0) body.for_seconds = Math.round(minutes * 60);
  const token = $("token").value.trim();
  sessionStorage.setItem("tenure-admin-token", token);
  const resp = await fetch("/api/action", {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Tenure-CSRF": "1", "Authorization": "Bearer " + token },
    body: JSON.stringify(body),
  });
  const answer = await resp.json().catch(() => ({ error: "HTTP " + resp.status }));
  if (!resp.ok) {
    error.hidden = false;
    error.textContent = answer.error || ("HTTP " + resp.status);
    return;
  }
  $("dialog").hidden = true;
  $("audit-section").hidden = false;
  const what = answer.evicted_sessions !== undefined ? " (" + answer.evicted_sessions + " session(s) ended)" : "";
  $("audit").append(el("li", answer.audit.time + "  " + answer.audit.action + " " + answer.audit.target +
    what + ": " + answer.audit.reason));
  note(dialogFor.name, answer.audit.action + " by admin: " + answer.audit.reason);
  dialogFor = null;
}

async function start() {
  const config = await fetch("/api/config").then((r) => r.json());
  state.admin = Boolean(config.admin);
  $("admin").hidden = !state.admin;
  if (state.admin) $("token").value = sessionStorage.getItem("tenure-admin-token") || "";
  $("dialog-cancel").addEventListener("click", () => { $("dialog").hidden = true; dialogFor = null; });
  $("dialog-form").addEventListener("submit", submitDialog);
  connect();
  setInterval(tick, 200);
}

start();
