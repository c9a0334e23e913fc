// photojobs console: plain script (no build step), same-origin fetches with the session cookie, live via
// SSE. Every view is a hash route whose filters and paging are in its query, so any view can be linked:
//   #/?state=&q=&after=&page=      jobs (filters, paging, bulk actions, submit and prune folded)
//   #/jobs/ID?state=&lane=&after=&page=   a job (times, ETA, failures, items, its events)
//   #/jobs/ID/items/ITEM            an item (its attempts with errors and tracebacks, its events)
//   #/lanes?range=3600              lanes (depth, throughput chart, pause/resume)
//   #/workers                       workers (what each thread runs now)
//   #/events?type=&job=             the event feed
// A new view is one call: defineView({ name, pattern, title, load }) plus a <div id="view-NAME"
// class="view" hidden> holding an <h2 tabindex="-1"> (focused when the view opens).
"use strict";
(function () {
  const $ = (sel) => document.querySelector(sel);
  const DONE = ["succeeded", "failed", "cancelled", "skipped"];
  const SVG = "http://www.w3.org/2000/svg";
  const jobs = new Map();          // the jobs page shown: job id -> STATUS
  const list = { state: "", q: "", after: null, page: 1, next: null, cursors: new Map() };
  const detail = { id: null, st: null, items: { state: "", lane: "", after: null, page: 1, next: null, cursors: new Map() } };
  const views = [];
  let current = { view: null, params: new URLSearchParams() };
  let source = null;
  let cursor = 0;
  const dirty = new Set();
  let refreshTimer = null;
  let lanesDirty = false;
  let offline = false;

  // -- the server: fetch, "unreachable, retrying" ---------------------------------------------------------------
  async function api(method, path, body) {
    const opts = { method, credentials: "same-origin", headers: {} };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, opts);
    } catch (e) {
      setOffline(true);
      const err = new Error("Server unreachable, retrying…"); err.status = 0; err.offline = true; throw err;
    }
    setOffline(false);
    let data = null;
    const text = await res.text();
    if (text) { try { data = JSON.parse(text); } catch (e) { data = { message: text }; } }
    if (res.status === 401) { showLogin(); }
    if (!res.ok) { const err = new Error((data && data.message) || res.statusText); err.status = res.status; err.data = data; throw err; }
    return data;
  }
  function setOffline(on) {
    if (on === offline) return;
    offline = on;
    $("#offline").hidden = !on;
    if (on) setLive(false);
  }
  setInterval(async () => {
    if (!offline) return;
    try { await api("GET", "api/session"); await route(); connect(); } catch (e) { /* still unreachable */ }
  }, 3000);
  function report(e) { if (e.status !== 401 && !e.offline) flash(e.message, "error"); }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") node.className = v;
      else if (k === "onclick") node.addEventListener("click", v);
      else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "style" || k === "scope") node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) {
      if (c === null || c === undefined || c === "") continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function link(href, text, cls) { return el("a", { href, class: cls }, text); }

  // -- preferences: theme and how times show ---------------------------------------------------------------------
  const prefs = { theme: localStorage.getItem("photojobs.theme") || "", times: localStorage.getItem("photojobs.times") || "" };
  function applyTheme() {
    if (prefs.theme) document.documentElement.dataset.theme = prefs.theme;
    else delete document.documentElement.dataset.theme;
  }
  applyTheme();
  $("#pref-theme").value = prefs.theme;
  $("#pref-times").value = prefs.times;
  $("#pref-theme").addEventListener("change", () => {
    prefs.theme = $("#pref-theme").value; localStorage.setItem("photojobs.theme", prefs.theme); applyTheme();
  });
  $("#pref-times").addEventListener("change", () => {
    prefs.times = $("#pref-times").value; localStorage.setItem("photojobs.times", prefs.times); tickTimes();
  });

  // -- times: relative, local or UTC; the other forms on hover -------------------------------------------------------
  const ZONE = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "local time";
  const pad = (n) => String(n).padStart(2, "0");
  function absolute(epoch) {
    const d = new Date(epoch * 1000);
    const off = -d.getTimezoneOffset();
    const sign = off >= 0 ? "+" : "-";
    const zone = `UTC${sign}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zone} (${ZONE})`;
  }
  function utc(epoch) {
    return new Date(epoch * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  function duration(seconds) {
    if (seconds == null) return "–";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }
  function relative(epoch) {
    const s = Math.round(Date.now() / 1000 - epoch);
    if (Math.abs(s) < 5) return "just now";
    const a = Math.abs(s);
    const text = a < 60 ? `${a} s` : a < 3600 ? `${Math.floor(a / 60)} min` : a < 86400 ? `${Math.floor(a / 3600)} h` : `${Math.floor(a / 86400)} d`;
    return s >= 0 ? `${text} ago` : `in ${text}`;
  }
  function shown(epoch) {
    if (prefs.times === "utc") return utc(epoch);
    if (prefs.times === "local") return absolute(epoch).replace(/ UTC[^ ]* \(.*\)$/, "");
    return relative(epoch);
  }
  function timeEl(epoch) {
    if (epoch == null) return el("span", {}, "–");
    const title = prefs.times === "utc" ? absolute(epoch) : prefs.times === "local" ? `${utc(epoch)} · ${relative(epoch)}` : absolute(epoch);
    return el("time", { dateTime: new Date(epoch * 1000).toISOString(), title, "data-epoch": String(epoch) }, shown(epoch));
  }
  function tickTimes() {
    for (const t of document.querySelectorAll("time[data-epoch]")) t.textContent = shown(Number(t.dataset.epoch));
  }
  setInterval(tickTimes, 10000);

  // -- status messages and confirmations (never a native alert or confirm) ----------------------------------------
  let flashTimer = null;
  function flash(text, kind) {
    const f = $("#flash");
    f.textContent = text;
    f.className = `flash ${kind || "note"}`;
    f.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { f.hidden = true; }, 8000);
  }
  function confirmAction(title, text, ok) {
    const dlg = $("#confirm");
    $("#confirm-title").textContent = title;
    $("#confirm-text").textContent = text;
    $("#confirm-ok").textContent = ok || "Confirm";
    dlg.returnValue = "";
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
      dlg.showModal();
      $("#confirm-cancel").focus();
    });
  }

  // -- login ----------------------------------------------------------------------------------------------------
  function showLogin() {
    if (source) { source.close(); source = null; }
    $("#main").hidden = true; $("#nav").hidden = true; $("#header-tools").hidden = true; $("#login").hidden = false;
    setLive(false);
    $("#login-title").focus();
  }
  async function showMain(who) {
    // A viewer (PHOTOJOBS_VIEWER_TOKEN) reads everything; the controls it may not use are hidden
    // (the server refuses them anyway: 403 read_only).
    document.body.dataset.role = (who && who.role) || "operator";
    $("#login").hidden = true; $("#main").hidden = false; $("#nav").hidden = false; $("#header-tools").hidden = false;
    connect();
    await route(false);
  }
  $("#login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("#login-error").textContent = "";
    try {
      await api("POST", "api/session", { token: $("#token").value });
      $("#token").value = "";
      await showMain(await api("GET", "api/session"));
    } catch (e) { $("#login-error").textContent = e.message; }
  });
  $("#logout").addEventListener("click", async () => { try { await api("DELETE", "api/session"); } catch (e) { /* gone anyway */ } showLogin(); });

  // -- the photo history page and the Undo button live in history.js (issue 31) ---------------------------------
  window.photojobsConsole = { api, el, timeEl, flash };  // for history.js (a photo's page, Undo)
  const hist = () => window.photojobsHistory;
  // -- routes: a registry of views -------------------------------------------------------------------------------
  function defineView(spec) { views.push(spec); }
  function parseHash() {
    const h = (location.hash || "#/").slice(1);
    const i = h.indexOf("?");
    return { path: i < 0 ? h : h.slice(0, i), params: new URLSearchParams(i < 0 ? "" : h.slice(i + 1)) };
  }
  function hashFor(path, params) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) if (v !== "" && v != null) qs.set(k, String(v));
    const q = qs.toString();
    return `#${path}${q ? "?" + q : ""}`;
  }
  function go(path, params) {
    const h = hashFor(path, params);
    if (h === location.hash) route(); else location.hash = h;
  }
  function hasView(name) { return views.some((v) => v.name === name); }
  async function route(focus) {
    if ($("#main").hidden) return;
    const { path, params } = parseHash();
    let found = null, match = null;
    for (const v of views) { match = v.pattern.exec(path); if (match) { found = v; break; } }
    if (!found) { found = views[0]; match = []; }
    const changed = current.view !== found.name;
    current = { view: found.name, params, match };
    for (const v of views) { const box = $(`#view-${v.name}`); if (box) box.hidden = v.name !== found.name; }
    for (const a of document.querySelectorAll("#nav a")) {
      const on = a.dataset.view === found.name || (a.dataset.view === "home" && (found.name === "job" || found.name === "item"));
      a.setAttribute("aria-current", on ? "page" : "false");
    }
    document.title = `${found.title(match, params)} · photojobs`;
    await found.load(match, params);
    if (focus !== false && changed) {
      const h = document.querySelector(`#view-${found.name} h2[tabindex]`);
      if (h) h.focus();
    }
  }
  window.addEventListener("hashchange", () => { route(); });

  // -- the jobs list: newest first, paged by cursor, filtered and searched; all in the URL ---------------------------
  function listKey() { return `${list.state}|${list.q}`; }
  defineView({
    name: "home",
    pattern: /^\/?$/,
    title: () => "jobs",
    load: async (m, params) => {
      detail.id = null;
      list.state = params.get("state") || "";
      list.q = params.get("q") || "";
      list.after = params.get("after");
      list.page = Math.max(1, Number(params.get("page") || 1)) || 1;
      if (list.after == null) list.page = 1;
      $("#job-state").value = list.state;
      $("#job-search").value = list.q;
      await loadJobs();
      await loadBulk();
    },
  });
  async function loadJobs() {
    const qs = new URLSearchParams({ limit: "20" });
    if (list.state) qs.set("state", list.state);
    if (list.q) qs.set("q", list.q);
    if (list.after != null) qs.set("after", list.after);
    try {
      const r = await api("GET", `api/jobs?${qs}`);
      jobs.clear();
      for (const j of r.jobs) jobs.set(j.job, j);
      list.next = r.next;
      list.cursors.set(`${listKey()}|${list.page}`, list.after);
      renderJobs();
    } catch (e) { pagingButtons(false); report(e); }
  }
  function listParams(extra) { return { state: list.state, q: list.q, ...extra }; }
  $("#jobs-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    go("/", { state: $("#job-state").value, q: $("#job-search").value.trim() });
  });
  // The paging buttons are off from a click until its page has loaded: a second click meanwhile would
  // page from the page still shown (the route has not run yet) and land where the first one did.
  function pagingButtons(busy) {
    $("#jobs-newer").disabled = busy || list.page <= 1;
    $("#jobs-older").disabled = busy || list.next == null;
  }
  $("#jobs-older").addEventListener("click", () => {
    if (list.next == null) return;
    pagingButtons(true);
    go("/", listParams({ after: list.next, page: list.page + 1 }));
  });
  $("#jobs-newer").addEventListener("click", () => {
    if (list.page <= 1) return;
    pagingButtons(true);
    const key = `${listKey()}|${list.page - 1}`;
    if (list.page - 1 > 1 && list.cursors.has(key)) go("/", listParams({ after: list.cursors.get(key), page: list.page - 1 }));
    else go("/", listParams({}));   // a linked page whose newer cursor is not known: the newest page
  });

  // bulk actions over everything the filter matches (a count, then a confirmation naming it)
  let bulkCount = null;
  async function loadBulk() {
    const box = $("#bulk");
    if (!list.state && !list.q) { box.hidden = true; bulkCount = null; return; }
    const qs = new URLSearchParams();
    if (list.state) qs.set("state", list.state);
    if (list.q) qs.set("q", list.q);
    try {
      const r = await api("GET", `api/bulk?${qs}`);
      bulkCount = r.count;
      box.hidden = false;
      box.dataset.count = String(r.count);
      $("#bulk-count").textContent = `${r.count} job(s) match this filter.`;
      for (const b of box.querySelectorAll("button")) b.disabled = r.count === 0;
    } catch (e) { box.hidden = true; report(e); }
  }
  const BULK = {
    retry: ["Retry every failed item", "Retry failed"],
    discard: ["Discard every failed item", "Discard failed"],
    cancel: ["Cancel every job", "Cancel jobs"],
  };
  for (const b of document.querySelectorAll("#bulk button")) {
    b.addEventListener("click", async () => {
      const action = b.dataset.action;
      if (bulkCount == null) return;
      const what = [list.state && `state ${list.state}`, list.q && `search “${list.q}”`].filter(Boolean).join(", ");
      const ok = await confirmAction(`${BULK[action][0]} of ${bulkCount} job(s)?`,
        `This acts on all ${bulkCount} job(s) matching ${what}, not only the page shown.` +
        (action === "retry" ? "" : " It cannot be undone."), BULK[action][1]);
      if (!ok) return;
      try {
        const r = await api("POST", "api/bulk", { action, state: list.state || null, q: list.q || null, expected: bulkCount });
        flash(`${action}: ${r.jobs} of ${r.matched} job(s) changed, ${r.items} item(s); ${r.skipped} had nothing to ${action}`, "note");
      } catch (e) {
        flash(e.status === 409 ? `${e.message}` : e.message, "error");
      }
      await loadJobs();
      await loadBulk();
    });
  }

  async function refreshJob(id) {
    try {
      const st = await api("GET", `api/jobs/${id}`);
      if (jobs.has(id)) { jobs.set(id, st); renderJobs(); }
      if (detail.id === id) { detail.st = st; renderDetail(); }
    } catch (e) { if (e.status === 404) { jobs.delete(id); renderJobs(); } }
  }
  function laneRow(lane, counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const done = DONE.reduce((a, s) => a + (counts[s] || 0), 0);
    const pct = total ? Math.floor((100 * done) / total) : 0;
    const seg = (cls, n) => el("span", { class: cls, style: `width:${total ? (100 * n) / total : 0}%` });
    const bar = el("div", { class: "bar", role: "progressbar", "data-percent": String(pct), "aria-valuenow": String(pct),
      "aria-valuemin": "0", "aria-valuemax": "100", "aria-label": `${lane} ${pct}%` },
    seg("ok", counts.succeeded || 0), seg("bad", counts.failed || 0),
    seg("other", (counts.cancelled || 0) + (counts.skipped || 0)), seg("run", counts.running || 0));
    const parts = [`${done}/${total}`, `${pct}%`];
    if (counts.failed) parts.push(`${counts.failed} failed`);
    if (counts.running) parts.push(`${counts.running} running`);
    return el("div", { class: "lane", "data-lane": lane, "data-percent": String(pct) },
      el("span", { class: "lane-name" }, lane), bar, el("span", { class: "counts" }, parts.join(" · ")));
  }
  // Actions that lose work or stop it ask first.
  const CONFIRM = {
    cancel: (id) => [`Cancel job #${id}?`, "Its items that have not run are cancelled now, running ones at their next safe point. A retry can run them again.", "Cancel job"],
    discard: (id, n) => [`Discard ${n} failed item(s) of job #${id}?`, "They become skipped (their errors kept) and a retry of the job no longer picks them up.", "Discard"],
  };
  async function act(id, name, query, count) {
    if (CONFIRM[name]) {
      const [title, text, ok] = CONFIRM[name](id, count);
      if (!(await confirmAction(title, text, ok))) return;
    }
    try {
      const r = await api("POST", `api/jobs/${id}/${name}${query || ""}`);
      flash(`job ${id}: ${name} — ${r.changed} item(s) changed`, "note");
    } catch (e) {
      flash(e.status === 409 ? `job ${id}: ${e.message} (the page was behind; refreshed)` : e.message, "error");
    }
    await refreshJob(id);
  }
  function action(id, name, enabled, query, label, count) {
    return el("button", { type: "button", class: `act-${name}`, disabled: !enabled, onclick: (ev) => { ev.stopPropagation(); act(id, name, query, count); } },
      label || name[0].toUpperCase() + name.slice(1));
  }
  // Why a job's items wait (store.waiting): one line per lane and reason.
  function waitingLine(w) {
    const n = `${w.items} item(s) of ${w.lane}`;
    if (w.reason === "lane paused") return [`${n} held: lane ${w.lane} paused `, w.since ? timeEl(w.since) : "", " (Lanes page: resume it)"];
    if (w.reason === "no live worker") return [`${n} wait: no live worker serves ${w.lane}`];
    if (w.reason === "photo locked") return [`${n} wait: photo locked by job `, ...w.jobs.flatMap((j, i) => [i ? ", " : "", link(`#/jobs/${j}`, `#${j}`)])];
    if (w.reason === "backoff") return [`${n} in backoff until `, timeEl(w.until)];
    if (w.reason === "job paused") return [`${n} paused with the job`];
    return [`${n}: ${w.reason}`];
  }
  function waitingBox(st) {
    if (!st.waiting || !st.waiting.length) return null;
    return el("ul", { class: "waiting", "aria-label": "why it waits" },
      ...st.waiting.map((w) => el("li", { "data-reason": w.reason, "data-lane": w.lane, "data-items": String(w.items) }, ...waitingLine(w))));
  }
  function shownState(st) { return st.waiting_for ? `waiting (${st.waiting_for})` : st.state; }
  function jobCard(st, linked) {
    const id = st.job;
    const t = st.totals || {};
    const title = `#${id} ${st.lane_order.join(" → ")}`;
    const head = el("div", { class: "job-head" },
      linked ? link(`#/jobs/${id}`, title, "title") : el("span", { class: "title" }, title),
      el("span", { class: `state ${st.waiting_for ? "paused" : st.state}`, "data-shown": shownState(st) }, shownState(st)),
      st.created_at ? el("span", { class: "note" }, "created ", timeEl(st.created_at)) : null,
      st.eta != null ? el("span", { class: "note eta", "data-eta": String(st.eta) }, `ETA ${duration(st.eta)}`) : null,
      el("div", { class: "actions" },
        action(id, "pause", st.state === "running"),
        action(id, "resume", st.state === "paused" || st.state === "pausing"),
        action(id, "cancel", ["running", "paused", "pausing", "submitting"].includes(st.state)),
        action(id, "retry", !!((t.failed || 0) + (t.cancelled || 0))),
        !linked && hist() ? hist().undoButton(id, st) : null));
    const lanes = st.lane_order.map((lane) => laneRow(lane, st.lanes[lane] || {}));
    return el("div", { class: "job", "data-job": String(id), "data-state": st.state }, head, waitingBox(st), ...lanes);
  }
  function renderJobs() {
    const box = $("#jobs");
    const ids = [...jobs.keys()].sort((a, b) => b - a);
    box.replaceChildren(...ids.map((id) => jobCard(jobs.get(id), true)));
    if (!ids.length) box.append(el("p", { class: "note" }, list.state || list.q ? "No job matches." : "No jobs yet."));
    pagingButtons(false);
    $("#jobs-page").textContent = `page ${list.page}` + (list.state ? ` · ${list.state}` : "") + (list.q ? ` · “${list.q}”` : "");
  }

  // -- submit and prune (folded on the jobs page) -----------------------------------------------------------------
  $("#submit-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const params = {};
    for (const line of $("#params").value.split("\n")) {
      const i = line.indexOf("=");
      if (line.trim() && i > 0) params[line.slice(0, i).trim()] = line.slice(i + 1);
    }
    const body = {
      lanes: $("#lanes").value.split(",").map((s) => s.trim()).filter(Boolean),
      paths: $("#paths").value.split("\n").map((s) => s.trim()).filter(Boolean),
      params,
    };
    const out = $("#submit-result");
    try {
      const r = await api("POST", "api/jobs", body);
      const left = Object.entries(r.skipped || {}).map(([why, n]) => `${n} ${why}`).join(", ");
      out.textContent = `job ${r.job} submitted: ${r.items} item(s)` + (left ? `; left out: ${left}` : "");
      out.className = "note";
      out.dataset.job = String(r.job);
      if (list.page === 1 && !list.state && !list.q) await loadJobs();
    } catch (e) { out.textContent = e.message; out.className = "error"; }
  });
  $("#prune-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const age = $("#prune-age").value.trim();
    const ok = await confirmAction(`Prune jobs finished more than ${age} ago?`,
      "Finished jobs whose last item changed before then are deleted with their items and events, and so is every older event. The metrics' counters keep counting them. This cannot be undone.", "Prune");
    if (!ok) return;
    try {
      const r = await api("POST", "api/prune", { older_than: age });
      $("#prune-result").textContent = `pruned ${r.jobs} job(s) and ${r.events} event(s)`;
      await loadJobs();
    } catch (e) { $("#prune-result").textContent = e.message; }
  });

  // -- a job's page ---------------------------------------------------------------------------------------------------
  defineView({
    name: "job",
    pattern: /^\/jobs\/(\d+)$/,
    title: (m) => `job #${m[1]}`,
    load: async (m, params) => {
      const id = Number(m[1]);
      if (detail.id !== id) { detail.id = id; detail.st = null; }
      const it = detail.items;
      it.state = params.get("state") || "";
      it.lane = params.get("lane") || "";
      it.after = params.get("after");
      it.page = it.after == null ? 1 : Math.max(1, Number(params.get("page") || 2)) || 2;
      $("#item-state").value = it.state;
      await loadJob();
      $("#item-lane").value = it.lane;
      await loadItems();
      await loadFeed("#job-events", { job: id, tail: 30 });
    },
  });
  async function loadJob() {
    const id = detail.id;
    try {
      detail.st = await api("GET", `api/jobs/${id}`);
      if (detail.id === id) renderDetail();
    } catch (e) {
      if (e.status === 404) {
        $("#detail-id").textContent = `#${id}`;
        $("#job-card").replaceChildren(el("p", { class: "error" }, `No job #${id} (never submitted, or pruned).`));
        $("#failures").replaceChildren(); $("#job-times").replaceChildren(); $("#job-params").replaceChildren();
      } else report(e);
    }
  }
  function fact(box, term, ...value) { box.append(el("dt", {}, term), el("dd", {}, ...value)); }
  function etaFact(box, times) {
    const rates = Object.entries(times.rates || {}).map(([l, r]) => `${l} ${r < 10 ? r.toFixed(2) : Math.round(r)}/s`).join(", ");
    const text = times.eta == null ? "measuring… (shown from 10 % of items, once each lane left has a run time and a live worker)" : `about ${duration(times.eta)}`;
    const dd = el("span", { id: "eta", "data-eta": times.eta == null ? "" : String(times.eta), "data-now": String(times.now) }, text);
    fact(box, "ETA", dd, rates ? el("span", { class: "note" }, ` (at ${rates})`) : null);
  }
  function renderDetail() {
    const st = detail.st;
    if (!st) return;
    $("#detail-id").textContent = `#${st.job}`;
    $("#job-card").replaceChildren(jobCard(st, false));
    const times = st.times || {};
    const tbox = $("#job-times");
    tbox.replaceChildren();
    fact(tbox, "Created", timeEl(times.created_at || st.created_at));
    fact(tbox, "Started", timeEl(times.started_at), times.waited != null ? ` (waited ${duration(times.waited)})` : "");
    fact(tbox, "Finished", timeEl(times.finished_at));
    fact(tbox, times.finished_at != null ? "Ran" : "Running for", duration(times.ran));
    if (times.took != null) fact(tbox, "Took", duration(times.took));
    if (times.finished_at == null) etaFact(tbox, times);
    const pbox = $("#job-params");
    pbox.replaceChildren();
    const entries = Object.entries(st.params || {}).filter(([k]) => !k.startsWith("job."));
    for (const [k, v] of entries) fact(pbox, k, typeof v === "string" ? v : JSON.stringify(v));
    if (!entries.length) fact(pbox, "none", "–");
    const laneSel = $("#item-lane");
    const want = st.lane_order.join(",");
    if (laneSel.dataset.lanes !== want) {
      const keep = detail.items.lane;
      laneSel.replaceChildren(el("option", { value: "" }, "any"), ...st.lane_order.map((l) => el("option", { value: l }, l)));
      laneSel.dataset.lanes = want;
      laneSel.value = keep;
    }
    renderFailures(st);
  }
  function groupQuery(g) { return `?lane=${encodeURIComponent(g.lane)}&reason=${encodeURIComponent(g.reason)}`; }
  function itemHref(job, item) { return `#/jobs/${job}/items/${item}`; }
  function exampleItem(job) {
    return (x) => {
      const id = x.item || x.id;
      return el("li", { "data-item": String(id) }, link(itemHref(job, id), `item ${id}`), x.path ? ` · ${x.path}` : "");
    };
  }
  function renderFailures(st) {
    const groups = st.failures || [];
    const box = $("#failures");
    box.replaceChildren(...groups.map((g) => {
      const examples = el("ul", {}, ...g.examples.map(exampleItem(st.job)));
      const buttons = [];
      if (g.state === "failed") {
        buttons.push(action(st.job, "retry", true, groupQuery(g), `Retry ${g.count}`));
        buttons.push(action(st.job, "discard", true, groupQuery(g), "Discard", g.count));
      }
      if (g.count > g.examples.length) {
        buttons.push(el("button", { type: "button", class: "act-show", onclick: () => showAll(st.job, g, examples) }, `Show all ${g.count}`));
      }
      const cascade = Object.entries(g.cascade || {});
      const caused = cascade.length
        ? el("p", { class: "cascade note", "data-skipped": String(g.cascade_total || 0), "data-lanes": String(cascade.length) },
          `and ${g.cascade_total} item(s) of ${cascade.length} later lane(s) skipped because of it: `,
          cascade.map(([lane, n]) => `${n} in ${lane}`).join(", "))
        : null;
      return el("div", { class: "failure", "data-lane": g.lane, "data-count": String(g.count), "data-state": g.state },
        el("div", { class: "failure-head" }, el("strong", {}, `${g.count} × ${g.state} in ${g.lane}`), el("span", { class: "actions" }, ...buttons)),
        el("div", { class: "reason" }, g.reason), caused, examples);
    }));
    if (!groups.length) box.append(el("p", { class: "note" }, "No failures."));
    const left = Object.entries(st.skipped || {}).map(([why, n]) => `${n} ${why}`).join(", ");
    if (left) box.append(el("p", { class: "note", id: "skipped" }, `Left out by the folder scan: ${left}.`));
  }
  async function showAll(id, g, ul) {
    const rows = [];
    let after = null;
    try {
      for (let i = 0; i < 20; i++) {
        const qs = new URLSearchParams({ lane: g.lane, reason: g.reason, state: g.state, limit: "1000" });
        if (after != null) qs.set("after", String(after));
        const r = await api("GET", `api/jobs/${id}/failures?${qs}`);
        rows.push(...r.items);
        if (r.next == null) break;
        after = r.next;
      }
      ul.replaceChildren(...rows.map(exampleItem(id)));
      ul.classList.add("all");
    } catch (e) { report(e); }
  }

  async function loadItems() {
    const id = detail.id;
    const it = detail.items;
    const qs = new URLSearchParams({ limit: "50" });
    if (it.state) qs.set("state", it.state);
    if (it.lane) qs.set("lane", it.lane);
    if (it.after != null) qs.set("after", it.after);
    try {
      const r = await api("GET", `api/jobs/${id}/items?${qs}`);
      if (detail.id !== id) return;
      it.next = r.next;
      it.cursors.set(`${id}|${it.state}|${it.lane}|${it.page}`, it.after);
      const cell = (label, ...c) => el("td", { "data-label": label }, ...c);
      $("#items tbody").replaceChildren(...r.items.map((x) => el("tr", { "data-item": String(x.id), "data-state": x.state },
        cell("item", link(itemHref(id, x.id), String(x.id))), cell("lane", x.lane), cell("state", el("span", { class: `state ${x.state}` }, x.state)),
        cell("attempts", String(x.attempt)), cell("worker", x.worker || "–"), cell("photo", x.photo != null ? photoRef(x.photo, x.path) : x.path && hist() ? hist().photoLink(x.path) : x.path || "–"),
        cell("error", x.error || ""), cell("updated", timeEl(x.updated_at)))));
      $("#items-first").disabled = it.page <= 1;
      $("#items-more").disabled = it.next == null;
      $("#items-page").textContent = r.items.length ? `page ${it.page}` : "no items match";
    } catch (e) { if (e.status !== 404) report(e); }
  }
  function itemParams(extra) { return { state: detail.items.state, lane: detail.items.lane, ...extra }; }
  $("#items-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    go(`/jobs/${detail.id}`, { state: $("#item-state").value, lane: $("#item-lane").value });
  });
  $("#items-more").addEventListener("click", () => {
    const it = detail.items;
    if (it.next == null) return;
    go(`/jobs/${detail.id}`, itemParams({ after: it.next, page: it.page + 1 }));
  });
  $("#items-first").addEventListener("click", () => { go(`/jobs/${detail.id}`, itemParams({})); });

  // -- an item's page: its attempts ---------------------------------------------------------------------------------
  defineView({
    name: "item",
    pattern: /^\/jobs\/(\d+)\/items\/(\d+)$/,
    title: (m) => `item ${m[2]} of job #${m[1]}`,
    load: async (m) => {
      const job = Number(m[1]), item = Number(m[2]);
      $("#item-back").href = `#/jobs/${job}`;
      $("#item-back").textContent = `← Job #${job}`;
      $("#item-title").textContent = `Item ${item} of job #${job}`;
      let r;
      try { r = await api("GET", `api/jobs/${job}/items/${item}`); } catch (e) {
        if (e.status === 404) {
          $("#item-facts").replaceChildren(el("dd", { class: "error" }, `Job #${job} has no item ${item} (or it was pruned).`));
          $("#attempts").replaceChildren(); $("#item-events").replaceChildren(); $("#item-actions").replaceChildren();
        } else report(e);
        return;
      }
      const x = r.item;
      const box = $("#item-facts");
      box.replaceChildren();
      fact(box, "Lane", x.lane);
      fact(box, "State", el("span", { class: `state ${x.state}`, id: "item-state-now" }, x.state));
      fact(box, "Photo", photoRef(x.photo, x.path));
      fact(box, "Attempts", String(x.attempt));
      if (x.worker) fact(box, "Worker", x.worker);
      if (x.error) fact(box, "Last error", el("span", { class: "mono" }, x.error));
      fact(box, "Updated", timeEl(x.updated_at));
      $("#item-actions").replaceChildren(
        action(job, "retry", x.state === "failed" || x.state === "cancelled", `?item=${item}`, "Retry this item"),
        action(job, "discard", x.state === "failed", `?item=${item}`, "Discard this item", 1));
      $("#attempts").replaceChildren(...r.attempts.map((a) => el("li", { class: "attempt", "data-outcome": a.outcome, "data-attempt": String(a.attempt) },
        el("div", { class: "attempt-head" }, el("strong", {}, `Attempt ${a.attempt}`), " ",
          el("span", { class: `state ${a.outcome === "succeeded" ? "succeeded" : a.outcome === "running" ? "running" : "failed"}` }, a.outcome.replace("_", " ")),
          " · claimed ", timeEl(a.claimed_at), a.waited != null ? ` after waiting ${duration(a.waited)}` : "",
          a.ran != null ? ` · ran ${duration(a.ran)}` : "", a.worker ? ` · ${a.worker}` : ""),
        a.error ? el("p", { class: "mono error-text" }, a.error) : null,
        a.traceback ? el("details", { class: "traceback" }, el("summary", {}, "Traceback"), el("pre", {}, a.traceback)) : null)));
      if (!r.attempts.length) $("#attempts").append(el("li", { class: "note" }, "Not claimed yet (or its events were pruned)."));
      renderFeed($("#item-events"), r.events, false);
    },
  });
  function photoRef(photo, path) {
    if (photo == null) return path || "–";
    // The photo page (another view) links here when it is defined.
    return hasView("photo") ? link(`#/photos/${photo}`, path || `photo ${photo}`) : (path || `photo ${photo}`);
  }

  // -- lanes: depth, throughput chart with axes and a range, pause/resume ------------------------------------------
  const RANGES = { 900: 15, 3600: 60, 21600: 300, 86400: 600 };  // window -> seconds per bar
  defineView({
    name: "lanes",
    pattern: /^\/lanes$/,
    title: () => "lanes",
    load: async (m, params) => {
      const range = RANGES[params.get("range")] ? params.get("range") : "3600";
      $("#lane-range").value = range;
      await loadLanes();
    },
  });
  $("#lane-range").addEventListener("change", () => go("/lanes", { range: $("#lane-range").value }));
  function fmtClock(epoch) {
    const d = new Date(epoch * 1000);
    return prefs.times === "utc" ? `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())} UTC` : `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }
  function svgEl(tag, attrs, text) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
    if (text != null) n.textContent = text;
    return n;
  }
  function chart(lane, counts, start, bucket) {
    const w = 640, h = 110, left = 34, bottom = 18, top = 6, n = counts.length || 1;
    const max = Math.max(1, ...counts);
    const total = counts.reduce((a, b) => a + b, 0);
    const ph = h - bottom - top, pw = w - left;
    const svg = svgEl("svg", { viewBox: `0 0 ${w} ${h}`, class: "chart", role: "img", "data-total": total, "data-max": max,
      "aria-label": `${lane}: ${total} items finished in the last ${duration(n * bucket)}, at most ${total ? max : 0} per ${duration(bucket)}` });
    const bw = pw / n;
    counts.forEach((c, i) => {
      if (!c) return;
      const bh = Math.max(2, ph * (c / max));
      const r = svgEl("rect", { x: left + i * bw + 0.5, y: top + ph - bh, width: Math.max(1, bw - 1), height: bh });
      r.append(svgEl("title", {}, `${c} finished in the ${duration(bucket)} from ${absolute(start + i * bucket)}`));
      svg.append(r);
    });
    svg.append(svgEl("line", { x1: left, x2: w, y1: top + ph + 0.5, y2: top + ph + 0.5, class: "axis" }));
    svg.append(svgEl("line", { x1: left - 0.5, x2: left - 0.5, y1: top, y2: top + ph, class: "axis" }));
    svg.append(svgEl("text", { x: left - 4, y: top + 8, "text-anchor": "end", class: "tick" }, String(max)));
    svg.append(svgEl("text", { x: left - 4, y: top + ph, "text-anchor": "end", class: "tick" }, "0"));
    svg.append(svgEl("text", { x: left, y: h - 4, "text-anchor": "start", class: "tick" }, fmtClock(start)));
    svg.append(svgEl("text", { x: left + pw / 2, y: h - 4, "text-anchor": "middle", class: "tick" }, fmtClock(start + (n * bucket) / 2)));
    svg.append(svgEl("text", { x: w, y: h - 4, "text-anchor": "end", class: "tick" }, "now"));
    return svg;
  }
  async function laneControl(lane, verb, pending) {
    if (verb === "pause") {
      const ok = await confirmAction(`Pause lane ${lane} for every job?`,
        `Nothing more of it starts (${pending} item(s) wait) until it is resumed; running items finish. Other lanes go on.`, "Pause lane");
      if (!ok) return;
    }
    try {
      const r = await api("POST", `api/lanes/${encodeURIComponent(lane)}/${verb}`);
      flash(r.changed ? `lane ${lane}: ${verb}d` : `lane ${lane} was already ${verb === "pause" ? "paused" : "running"}`, "note");
    } catch (e) { report(e); }
    await loadLanes();
  }
  async function loadLanes() {
    const range = $("#lane-range").value || "3600";
    let r;
    try { r = await api("GET", `api/console/lanes?window=${range}&bucket=${RANGES[range] || 60}`); } catch (e) { report(e); return; }
    const cards = r.lanes.map((l) => {
      const d = l.depth || {};
      const total = l.finished_total || 0;
      const stat = (name, value, label) => el("div", { class: "stat" }, el("span", { class: "num" }, String(value)), el("span", { class: "note" }, label || name));
      const waiting = (d.pending || 0) + (d.queued || 0);
      const workers = l.workers.length
        ? el("ul", { class: "lane-workers" }, ...l.workers.map((w) => el("li", {},
          link("#/workers", `${w.host}:${w.pid}`), ` — ${w.running} running now, ${w.held} held`)))
        : el("p", { class: "note" }, "no live worker serves this lane");
      return el("section", { class: "lane-card panel", "data-lane": l.lane, "data-paused": String(!!l.paused),
        "data-pending": String(d.pending || 0), "data-queued": String(d.queued || 0), "data-running": String(d.running || 0),
        "data-running-now": String(l.running_now || 0), "data-finished": String(total), "aria-label": `lane ${l.lane}` },
      el("div", { class: "job-head" }, el("h3", {}, l.lane),
        el("span", { class: `state ${l.paused ? "paused" : "running"}` }, l.paused ? "paused" : "running"),
        l.paused && l.paused_at ? el("span", { class: "note" }, "since ", timeEl(l.paused_at)) : null,
        el("div", { class: "actions" },
          el("button", { type: "button", class: "act-lane-pause", disabled: !!l.paused, onclick: () => laneControl(l.lane, "pause", waiting) }, "Pause lane"),
          el("button", { type: "button", class: "act-lane-resume", disabled: !l.paused, onclick: () => laneControl(l.lane, "resume") }, "Resume lane"))),
      el("div", { class: "stats" }, stat("waiting", d.waiting || 0), stat("pending", d.pending || 0), stat("queued", d.queued || 0),
        stat("running now", l.running_now || 0), stat("held", d.running || 0), stat("paused", d.paused || 0),
        stat("finished", total, `finished, last ${duration(r.window)}`)),
      chart(l.lane, l.finished || [], r.start, r.bucket),
      el("dl", { class: "lane-times" }, ...[["run", "run time"], ["wait", "queue wait"]].flatMap(([k, label]) => {
        const t = l[k] || {};
        const secs = (v) => v == null ? "–" : v < 10 ? `${v.toFixed(2)} s` : duration(v);
        return [el("dt", {}, label), el("dd", { "data-times": k, "data-p50": t.p50 == null ? "" : String(t.p50),
          "data-p95": t.p95 == null ? "" : String(t.p95) }, t.count ? `p50 ${secs(t.p50)} · p95 ${secs(t.p95)} (${t.count} attempts)` : "no attempt yet")];
      })),
      el("h4", {}, "Live workers"), workers);
    });
    $("#lane-cards").replaceChildren(...cards);
  }
  setInterval(() => { if (!$("#main").hidden && current.view === "lanes" && !offline) loadLanes(); }, 2000);

  // -- workers: each process, its threads and what each busy one runs now ---------------------------------------------
  // a photo's history (#/photos/ID, #/photo?path=P): drawn by history.js into #view-photo
  defineView({ name: "photo", pattern: /^\/photos\/\d+$|^\/photo$/, title: () => "photo",
    load: async () => { if (hist()) await hist().show(location.hash); } });
  defineView({ name: "workers", pattern: /^\/workers$/, title: () => "workers", load: () => loadWorkers() });
  async function loadWorkers() {
    let r;
    try { r = await api("GET", "api/workers"); } catch (e) { report(e); return; }
    const cards = r.workers.map((w) => {
      const state = w.state || "live";
      let beat = "–";
      if (state === "stopped" && w.stopped_at) beat = el("span", {}, "stopped ", timeEl(w.stopped_at));
      else if (w.heartbeat_age != null) beat = el("span", { "data-age": String(w.heartbeat_age) }, `last heartbeat ${duration(w.heartbeat_age)} ago`);
      const busy = w.running || [];
      const idle = w.threads != null ? Math.max(0, w.threads - busy.length) : null;
      const rows = busy.map((t) => el("li", { class: "thread", "data-job": String(t.job), "data-item": String(t.item), "data-lane": t.lane },
        el("span", { class: "mono" }, t.thread || "thread"), ": ",
        link(`#/jobs/${t.job}`, `job #${t.job}`), " · ", link(itemHref(t.job, t.item), `item ${t.item}`),
        ` · ${t.lane} · `, photoRef(t.photo, t.path), " · since ", timeEl(t.since)));
      const waiting = w.held - busy.length;
      return el("section", { class: `worker panel worker-${state}`, "data-worker": w.id, "data-state": state, "aria-label": `worker ${w.host}:${w.pid}` },
        el("div", { class: "job-head" }, el("h3", {}, `${w.host}:${w.pid ?? "?"}`), el("span", { class: `state ${state === "live" ? "running" : state === "stale" ? "failed" : "cancelled"}` }, state), el("span", { class: "note" }, beat)),
        el("p", { class: "note" }, `lanes: ${w.lanes.join(", ") || "–"} · threads: ${w.threads ?? "?"}` + (idle != null ? ` (${idle} idle)` : "") +
          ` · items held: ${w.held}` + (waiting > 0 ? ` (${waiting} waiting in a batch)` : "")),
        busy.length ? el("ul", { class: "threads" }, ...rows) : el("p", { class: "note" }, state === "live" ? "idle" : "–"));
    });
    $("#workers").replaceChildren(...cards);
    $("#no-workers").hidden = cards.length > 0;
    loadWebhooks();
  }
  // each webhook target's job_finished delivery (GET api/webhooks): cursor, lag, counts, last answer
  async function loadWebhooks() {
    let r;
    try { r = await api("GET", "api/webhooks"); } catch (e) { return; }
    const rows = r.webhooks.map((h) => el("tr", { "data-target": h.target },
      el("td", { class: "mono" }, h.host), el("td", {}, String(h.cursor)), el("td", {}, String(h.lag)),
      el("td", {}, String(h.delivered)), el("td", {}, String(h.failures)),
      el("td", {}, h.last_status != null ? String(h.last_status) : "–", h.last_error ? ` (${h.last_error})` : ""),
      el("td", {}, h.attempts && h.next_attempt_at ? el("span", {}, `attempt ${h.attempts + 1} at `, timeEl(h.next_attempt_at)) : "–"),
      el("td", {}, h.last_delivered_at ? timeEl(h.last_delivered_at) : "–")));
    $("#webhooks").replaceChildren(...rows);
    $("#webhooks-panel").hidden = rows.length === 0 && !r.configured;
  }
  setInterval(() => { if (!$("#main").hidden && current.view === "workers" && !offline) loadWorkers(); }, 2000);

  // -- schedules: each one's cadence, command, last and next run, pause/resume ----------------------------------------
  defineView({ name: "schedules", pattern: /^\/schedules$/, title: () => "schedules", load: () => loadSchedules() });
  async function scheduleControl(name, verb) {
    try {
      const r = await api("POST", `api/schedules/${encodeURIComponent(name)}/${verb}`);
      flash(r.changed ? `schedule ${name}: ${verb}d` : `schedule ${name} was already ${verb === "pause" ? "paused" : "running"}`, "note");
    } catch (e) { report(e); }
    await loadSchedules();
  }
  async function loadSchedules() {
    let r;
    try { r = await api("GET", "api/schedules"); } catch (e) { report(e); return; }
    const cards = r.schedules.map((s) => {
      const state = s.paused ? "paused" : s.running ? "running" : "waiting";
      const cadence = s.every != null ? `every ${duration(s.every)}` : `cron ${s.cron}`;
      const last = s.last_run
        ? el("span", {}, "last run ", timeEl(s.last_run.at), s.last_run.job != null ? el("span", {}, " → ", link(`#/jobs/${s.last_run.job}`, `job #${s.last_run.job}`)) : " (nothing to do)")
        : "never run";
      return el("section", { class: "schedule panel", "data-schedule": s.name, "data-state": state, "data-runs": String(s.runs), "data-skipped": String(s.skipped), "aria-label": `schedule ${s.name}` },
        el("div", { class: "job-head" }, el("h3", {}, s.name),
          el("span", { class: `state ${s.paused ? "paused" : "running"}` }, state),
          el("div", { class: "actions" },
            el("button", { type: "button", class: "act-schedule-pause", disabled: !!s.paused, onclick: () => scheduleControl(s.name, "pause") }, "Pause"),
            el("button", { type: "button", class: "act-schedule-resume", disabled: !s.paused, onclick: () => scheduleControl(s.name, "resume") }, "Resume"))),
        el("p", { class: "mono" }, s.command.join(" ")),
        el("p", { class: "note" }, `${cadence} · `, last, " · next ", timeEl(s.next_run), ` · ${s.runs} run(s), ${s.skipped} skipped`),
        s.last_error ? el("p", { class: "note error" }, `last error: ${s.last_error}`) : null);
    });
    $("#schedules").replaceChildren(...cards);
    $("#no-schedules").hidden = cards.length > 0;
  }
  setInterval(() => { if (!$("#main").hidden && current.view === "schedules" && !offline) loadSchedules(); }, 5000);

  // -- the event feed --------------------------------------------------------------------------------------------------
  defineView({
    name: "events",
    pattern: /^\/events$/,
    title: () => "events",
    load: async (m, params) => {
      const type = params.get("type") || "";
      const sel = $("#event-type");
      if (type && ![...sel.options].some((o) => o.value === type)) sel.append(el("option", { value: type }, type));
      sel.value = type;
      $("#event-job").value = params.get("job") || "";
      const q = { tail: 100 };
      if (params.get("type")) q.type = params.get("type");
      if (params.get("job")) q.job = params.get("job");
      await loadFeed("#events", q);
    },
  });
  $("#events-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    go("/events", { type: $("#event-type").value, job: $("#event-job").value.trim() });
  });
  function summary(e) {
    const d = e.detail || {};
    const parts = [];
    if (d.error) parts.push(d.error);
    if (d.reason) parts.push(d.reason);
    if (d.state) parts.push(`→ ${d.state}`);
    if (d.delay != null) parts.push(`retry in ${duration(d.delay)}`);
    if (d.by) parts.push(`by ${d.by}`);
    if (d.items != null && typeof d.items === "number") parts.push(`${d.items} item(s)`);
    if (d.photos != null && typeof d.photos === "number") parts.push(`${d.photos} photo(s)`);
    if (d.waited != null) parts.push(`waited ${duration(d.waited)}`);
    if (d.cancelled_now != null) parts.push(`${d.cancelled_now} cancelled now`);
    return parts.join(" · ");
  }
  function feedItem(e) {
    const refs = [];
    if (e.job != null) refs.push(link(`#/jobs/${e.job}`, `job #${e.job}`));
    if (e.item != null && e.job != null) refs.push(link(itemHref(e.job, e.item), `item ${e.item}`));
    if (e.photo != null) refs.push(photoRef(e.photo, null));
    if (e.lane) refs.push(e.lane);
    const what = summary(e);
    const li = el("li", { "data-cursor": String(e.cursor), "data-type": e.type },
      el("span", { class: "cursor" }, String(e.cursor)), " ", timeEl(e.at), " ", el("strong", { class: "type" }, e.type));
    for (const r of refs) li.append(" · ", r instanceof Node ? r : document.createTextNode(r));
    if (what) li.append(el("span", { class: "detail" }, what));
    return li;
  }
  function renderFeed(box, events, newestFirst) {
    const items = events.map(feedItem);
    box.replaceChildren(...(newestFirst === false ? items : items.reverse()));
    if (!events.length) box.append(el("li", { class: "note" }, "No events."));
  }
  async function loadFeed(sel, q) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(q)) qs.set(k, String(v));
    try {
      const r = await api("GET", `api/events?${qs}`);
      const box = $(sel);
      box.dataset.filter = JSON.stringify(q);
      renderFeed(box, r.events, true);
      cursor = Math.max(cursor, r.next || 0);
    } catch (e) { report(e); }
  }
  function feedMatches(box, e) {
    const q = JSON.parse(box.dataset.filter || "{}");
    if (q.job != null && String(e.job) !== String(q.job)) return false;
    if (q.type && !q.type.split(",").includes(e.type)) return false;
    return true;
  }
  function addLive(e) {
    const boxes = current.view === "events" ? ["#events"] : current.view === "job" ? ["#job-events"] : [];
    for (const sel of boxes) {
      const box = $(sel);
      if (!feedMatches(box, e)) continue;
      const none = box.querySelector("li.note");
      if (none) none.remove();
      box.prepend(feedItem(e));
      while (box.children.length > 100) box.lastChild.remove();
    }
  }

  // -- live: the event stream --------------------------------------------------------------------------------------------
  function setLive(on) {
    const b = $("#live");
    b.textContent = on ? "live" : "offline";
    b.className = on ? "live on" : "live off";
  }
  async function connect() {
    if (source) source.close();
    if (!cursor) {
      try { cursor = (await api("GET", "api/events?tail=1")).next || 0; } catch (e) { return; }
    }
    source = new EventSource(`api/events/stream?after=${cursor}`);
    source.onopen = () => { setLive(true); setOffline(false); };
    source.onerror = () => setLive(false);   // the browser reconnects with Last-Event-ID
    const onEvent = (msg) => {
      const e = JSON.parse(msg.data);
      cursor = Math.max(cursor, e.cursor);
      addLive(e);
      if (e.job != null) dirty.add(e.job);
      if (e.type === "job_submitted") dirty.add("list");
      if (e.type === "lane_paused" || e.type === "lane_resumed") lanesDirty = true;
      if (!refreshTimer) refreshTimer = setTimeout(flush, 300);
    };
    // Every event type arrives as its own SSE event name: listen to the generic handler for all.
    source.addEventListener("message", onEvent);
    const types = ["job_submitted", "item_created", "item_queued", "item_claimed", "item_claim_failed", "item_succeeded",
      "item_failed", "item_retry_scheduled", "item_cancelled", "item_paused", "item_resumed", "item_released", "item_ready",
      "item_skipped", "item_deferred", "item_retried", "item_discarded", "item_republished", "item_waiting", "item_pending",
      "job_cancel_requested", "job_pause_requested", "job_resumed", "job_retried", "lane_paused", "lane_resumed",
      "lease_expired", "stale_commit_rejected", "message_rejected", "intent_recorded", "intent_applied", "intent_discarded"];
    for (const t of types) source.addEventListener(t, onEvent);
  }
  async function flush() {
    refreshTimer = null;
    const ids = [...dirty]; dirty.clear();
    const view = current.view;
    if (view === "home") {
      const newer = ids.includes("list") || ids.some((id) => typeof id === "number" && !jobs.has(id) && id > Math.max(0, ...jobs.keys()));
      if (newer && list.page === 1) await loadJobs();
      else for (const id of ids) if (jobs.has(id)) await refreshJob(id);
    } else if (view === "job" && ids.includes(detail.id)) {
      await loadJob();
      await loadItems();
    } else if (view === "lanes" && lanesDirty) {
      lanesDirty = false;
      await loadLanes();
    }
  }
  // The ETA and durations move between events too.
  setInterval(() => { if (!$("#main").hidden && current.view === "job" && detail.st && !offline && detail.st.times && detail.st.times.finished_at == null) loadJob(); }, 2000);

  // -- start ------------------------------------------------------------------------------------------------------------
  api("GET", "api/session").then(showMain).catch((e) => { if (e.offline) { setOffline(true); showLogin(); } else showLogin(); });
})();
