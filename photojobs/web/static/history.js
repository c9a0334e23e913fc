// photojobs console: a photo's history page (#/photos/ID, #/photo?path=P) and the Undo button of a job
// page (issue 31). Uses app.js's helpers (window.photojobsConsole); app.js calls window.photojobsHistory.
"use strict";
(function () {
  const KINDS = { "metadata edit": "edit", rename: "move", move: "move", archive: "move", upload: "copy",
    "upload removed": "copy", "upload left in place": "copy", "file removed": "copy", restored: "edit" };

  const armed = new Set();  // jobs whose Undo was clicked once
  function c() { return window.photojobsConsole; }
  function short(sha) { return sha ? sha.slice(0, 12) + "…" : "–"; }
  function value(v) { return v === null || v === undefined ? "–" : typeof v === "string" ? v : JSON.stringify(v); }

  function view() {
    let box = document.querySelector("#view-photo");
    if (!box) {
      const { el } = c();
      box = el("div", { id: "view-photo", class: "view", hidden: true },
        el("p", {}, el("a", { href: "#/", class: "back" }, "← All jobs")),
        el("section", { class: "panel", id: "photo-panel", "aria-labelledby": "photo-title" },
          el("h2", { id: "photo-title", tabindex: "-1" }, "Photo ", el("span", { id: "photo-id" })),
          el("p", { id: "photo-path", class: "note" }),
          el("table", { id: "photo-history", class: "items stack" },  // stacked cards below 700 px
            el("thead", {}, el("tr", {}, ...["when", "job", "lane", "what", "from → to", "sha256 before → after", "changes", "undone by"]
              .map((h) => el("th", { scope: "col" }, h)))),
            el("tbody", {}))));
      document.querySelector("main").append(box);
    }
    return box;
  }

  function entryRow(e) {
    const { el, timeEl } = c();
    const cell = (label, ...x) => el("td", { "data-label": label }, ...x);
    const dest = e.target ? `${e.to_path} (target ${e.target})` : e.to_path;  // a remote upload: its target's name
    const where = e.from_path && e.from_path !== e.to_path ? `${e.from_path} → ${dest}` : dest;
    const changes = el("ul", { class: "changes", style: "margin:0;padding-left:1em" }, ...Object.entries(e.changes || {}).map(([tag, [b, a]]) =>
      el("li", { "data-tag": tag }, `${tag}: ${value(b)} → ${value(a)}`)));
    return el("tr", { "data-effect": String(e.effect), "data-kind": KINDS[e.kind] || "other", "data-undone": e.undone_by == null ? "no" : "yes" },
      cell("when", timeEl(e.when)),
      cell("job", e.job == null ? "found by sync" : el("a", { href: `#/jobs/${e.job}` }, `#${e.job}`)),
      cell("lane", e.lane),
      cell("what", e.kind + (e.sidecar ? " (sidecar)" : "") + (e.undoes_job != null ? ` (undo of job ${e.undoes_job})` : "")),
      cell("from → to", where),
      cell("sha256", el("span", { title: `${e.before_sha256 || "nothing"} → ${e.after_sha256 || "nothing"}` },
        `${short(e.before_sha256)} → ${short(e.after_sha256)}`)),
      cell("changes", changes),
      cell("undone by", e.undone_by == null ? "–" : el("a", { href: `#/jobs/${e.undone_by}` }, `#${e.undone_by}`)));
  }

  async function show(hash) {
    const { api, el, flash } = c();
    const box = view();
    box.hidden = false;
    const byId = /^#\/photos\/(\d+)$/.exec(hash);
    const byPath = /^#\/photo\?path=(.+)$/.exec(hash);
    const url = byId ? `api/photos/${byId[1]}/history` : `api/photos?path=${byPath ? byPath[1] : ""}`;
    const body = box.querySelector("#photo-history tbody");
    try {
      const r = await api("GET", url);
      document.title = `photo #${r.photo} · photojobs`;
      box.querySelector("#photo-id").textContent = `#${r.photo}`;
      box.querySelector("#photo-path").textContent = r.path;
      body.replaceChildren(...r.history.map(entryRow));
      if (!r.history.length) body.append(el("tr", {}, el("td", { colSpan: 8, class: "note" }, "No job changed this photo.")));
    } catch (e) {
      body.replaceChildren();
      box.querySelector("#photo-path").textContent = e.status === 404 ? "No such photo is known to photojobs." : e.message;
      if (e.status !== 404 && e.status !== 401) flash(e.message, "error");
    }
  }

  function photoLink(path) {
    const { el } = c();
    return el("a", { href: `#/photo?path=${encodeURIComponent(path)}`, class: "photo-link" }, path);
  }

  function undoButton(id, st) {
    const { api, el, flash } = c();
    const hasEffects = (st.lane_order || []).some((l) => ["exif", "rename", "archive", "upload"].includes(l));
    const done = !["running", "paused", "pausing", "submitting", "cancelling"].includes(st.state);
    return el("button", { type: "button", class: "act-undo", disabled: !(hasEffects && done),
      title: "Put back what this job did to its photos (a job of its own); photos changed since are refused",
      onclick: async (ev) => {
        ev.stopPropagation();
        const button = ev.currentTarget;
        if (!armed.has(id)) {  // a second click confirms (no native dialog); kept across re-renders
          armed.add(id);
          button.textContent = "Confirm undo";
          flash(`Undo job ${id}? Its photos go back as they were before it ran. Click “Confirm undo”.`, "note");
          return;
        }
        armed.delete(id);
        button.disabled = true;
        try {
          const r = await api("POST", `api/jobs/${id}/undo`, {});
          if (r.job == null) flash(`job ${id}: ${r.note}`, "note");
          else { flash(`job ${id}: undo job ${r.job} submitted (${r.items} item(s))`, "note"); location.hash = `#/jobs/${r.job}`; }
        } catch (e) { flash(e.message, "error"); }
      } }, armed.has(id) ? "Confirm undo" : "Undo");
  }

  function isPhotoRoute(hash) { return /^#\/photos\/\d+$/.test(hash) || /^#\/photo\?path=/.test(hash); }
  function hide() { const box = document.querySelector("#view-photo"); if (box) box.hidden = true; }

  window.photojobsHistory = { isPhotoRoute, show, hide, photoLink, undoButton };
})();
