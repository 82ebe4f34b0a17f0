/* ror_annotate viewer: one small script for every page of the static site.
 *
 * Data arrive as JSONP-style files (data/*.js call ROR.index / ROR.rows / ROR.shard / ROR.dashboard / ROR.cell)
 * because a page opened from file:// may load <script src> but not fetch() a file. Everything that grows
 * with the corpus is sharded and loaded on demand: index rows (data/rows/K.js, loaded one after another
 * while the first ones are shown; only the rows in view are in the DOM), one file per trace, one per
 * confusion cell.
 * Safety: data only ever reach the DOM through textContent / attributes, never innerHTML.
 */
"use strict";
var ROR = (function () {
  var S = { index: null, dashboard: null, shards: {}, waiting: {}, onRows: null, onCell: null };
  var SHORT = { planning: "PLAN", execution: "EXEC", restatement: "REST", fact: "FACT", reflection: "REFL", conclusion: "CONC" };

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function $(id) { return document.getElementById(id); }
  function params() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      if (!kv) return;
      var i = kv.indexOf("=");
      try {
        out[decodeURIComponent(i < 0 ? kv : kv.slice(0, i))] = i < 0 ? "" : decodeURIComponent(kv.slice(i + 1));
      } catch (e) { /* a malformed escape in a hand-edited link (#t=%E0): that part is ignored, the page still opens */ }
    });
    return out;
  }
  function hash(obj) {
    return "#" + Object.keys(obj).filter(function (k) { return obj[k] !== null && obj[k] !== undefined && obj[k] !== ""; })
      .map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(obj[k]); }).join("&");
  }
  // parts joined by " · ", each in its own <bdi>: a right-to-left override (U+202E) in a model or
  // dataset name reorders that name only, never its neighbours (textContent is the plain join)
  function joined(box, parts) {
    box.textContent = "";
    parts.filter(function (x) { return x; }).forEach(function (x, i) {
      if (i) box.appendChild(document.createTextNode(" · "));
      box.appendChild(el("bdi", null, x));
    });
  }
  function known(v) { return v === null || v === undefined ? "unknown" : v; }
  // as Python's format (and so `ror agree`'s tables): an exact tie (0.5625 to 3 places) rounds half to
  // even ("0.562"); toFixed rounds it up ("0.563"). toFixed(100) is the exact decimal value of the double.
  function fmt(v, d) {
    if (v === null || v === undefined) return "n/a";
    d = d === undefined ? 3 : d;
    var x = Number(v), out = x.toFixed(d);
    if (!isFinite(x) || Math.abs(x) >= 1e21) return out;
    var full = Math.abs(x).toFixed(100), cut = full.indexOf(".") + 1 + d;
    if (/^50*$/.test(full.slice(cut))) {
      var kept = full.slice(0, d ? cut : cut - 1);
      if (Number(kept.charAt(kept.length - 1)) % 2 === 0) out = (x < 0 ? "-" : "") + kept;
    }
    return out;
  }
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }
  function pct(v) { return v === null || v === undefined ? "n/a" : (100 * v).toFixed(1) + "%"; }
  function shardPath(n) { return "data/t/" + Math.floor(n / S.index.shard_dir_size) + "/" + n + ".js"; }
  function loadShard(n, done) {
    if (S.shards[n]) return done(S.shards[n]);
    (S.waiting[n] = S.waiting[n] || []).push(done);
    if (S.waiting[n].length > 1) return;
    var s = el("script", { src: shardPath(n) });
    s.onerror = function () { var m = $("main"); m.insertBefore(el("p", { "class": "error" }, "Cannot load the data of trace " + n + " (" + shardPath(n) + ")."), m.firstChild); };
    document.body.appendChild(s);
  }
  function raterName(i) { var r = S.index.raters[i]; return r ? r.name : "?"; }
  function raterLabel(i) { var r = S.index.raters[i]; return r ? r.name + " (" + r.source + ")" : "?"; }
  function beh(i) { return S.index.behaviors[i]; }
  function chip(label, extra) {
    var c = el("span", { "class": "chip lab-" + label + (extra ? " " + extra : ""), "data-mark": SHORT[label] || label }, label);
    return c;
  }
  function legend(target) {
    var box = $(target);
    if (!box) return;
    box.appendChild(el("span", { "class": "muted" }, "Legend: "));
    S.index.behaviors.forEach(function (b) { box.appendChild(chip(b)); });
    box.appendChild(el("span", { "class": "chip unl", "data-mark": "----" }, "no label"));
  }
  function loadScript(src, onerror) {
    var s = el("script", { src: src });
    if (onerror) s.onerror = onerror;
    document.body.appendChild(s);
  }

  // ------------------------------------------------------------------------------------- index
  function pageIndex() {
    // Rows arrive shard by shard (data/rows/K.js); filtering and sorting run over the rows loaded so far and
    // again as each shard arrives. The table is virtualised: only the rows in view (plus a margin) are in the
    // DOM, the rest of the list's height is padding on its wrapper, so 10,000 or 1,000,000 rows scroll alike.
    var M = S.index, cols = M.columns, rows = [], hits = [], key = "n", dir = 1, loaded = 0, rowH = 0, queued = false;
    var wrap = $("traces-wrap"), table = $("traces"), body = table.tBodies[0], OVER = 30;
    $("summary").textContent = plural(M.n_traces, "trace") + ", " + plural(M.raters.length, "rater") + (M.raters.length ? " (" +
      M.raters.map(function (r) { return r.name; }).join(", ") + ")" : "") + (M.origin ? " from " + M.origin : "") +
      (M.raters.length < 2 ? " · " + (M.raters.length ? "one rater" : "no labels") + ": no agreement or disagreements to show" : "");
    function rowEl(t) {
      var tr = el("tr", { "data-n": t.n });
      var td = el("td"); td.appendChild(el("a", { href: "trace.html" + hash({ t: t.n }), title: t.id }, t.id)); tr.appendChild(td);  // a long id is cut with "…": whole on hover
      tr.appendChild(el("td", null, t.model || ""));
      tr.appendChild(el("td", null, t.dataset || ""));
      tr.appendChild(el("td", { "class": "num" }, t.chars));
      tr.appendChild(el("td", { "class": "num" }, t.segments));
      tr.appendChild(el("td", null, t.correct === null ? "" : t.correct ? "yes" : "no"));
      tr.appendChild(el("td", { "class": "num" }, t.agreement === null ? "" : pct(t.agreement)));
      tr.appendChild(el("td", { "class": "num" }, t.disagreements));
      return tr;
    }
    function draw() {
      queued = false;
      var start = wrap.getBoundingClientRect().top + window.scrollY + (table.tHead ? table.tHead.offsetHeight : 0);
      var first = 0, last = Math.min(hits.length, 2 * OVER);
      if (rowH) {
        first = Math.max(0, Math.floor((window.scrollY - start) / rowH) - OVER);
        first = Math.min(first, Math.max(0, hits.length - 1));
        last = Math.min(hits.length, first + Math.ceil(window.innerHeight / rowH) + 2 * OVER);
      }
      var frag = document.createDocumentFragment();
      for (var i = first; i < last; i++) frag.appendChild(rowEl(hits[i]));
      body.textContent = "";
      body.appendChild(frag);
      if (!rowH && body.rows.length) { rowH = body.rows[0].getBoundingClientRect().height || 0; if (rowH) return draw(); }
      wrap.style.paddingTop = (first * rowH) + "px";
      wrap.style.paddingBottom = ((hits.length - last) * rowH) + "px";
      table.setAttribute("data-first", first);
    }
    function schedule() { if (!queued) { queued = true; window.requestAnimationFrame(draw); } }
    function render() {
      var q = $("search").value.trim().toLowerCase(), dis = $("only-dis").checked;
      hits = rows.filter(function (t) {
        if (dis && !t.disagreements) return false;
        if (!q) return true;
        return [t.id, t.model, t.dataset].some(function (v) { return v && String(v).toLowerCase().indexOf(q) >= 0; });
      });
      hits.sort(function (a, b) {
        var x = a[key], y = b[key];
        if (x === y) return a.n - b.n;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * dir;
      });
      draw();
      $("count").textContent = hits.length + " shown" + (loaded < M.index_shards ? " (loading: " + rows.length + " of " + M.n_traces + " traces read)" : "");
      table.setAttribute("data-loaded", loaded < M.index_shards ? "partial" : "all");
    }
    Array.prototype.forEach.call(document.querySelectorAll("#traces th"), function (th) {
      th.tabIndex = 0;
      function sort() {
        var k = th.getAttribute("data-key");
        dir = key === k ? -dir : 1; key = k;
        Array.prototype.forEach.call(document.querySelectorAll("#traces th"), function (o) { o.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        render();
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
    $("search").addEventListener("input", render);
    $("only-dis").addEventListener("change", render);
    window.addEventListener("scroll", schedule);
    window.addEventListener("resize", schedule);
    S.onRows = function (d) {
      if (d.k !== loaded) return;
      d.rows.forEach(function (r) { var o = {}; for (var i = 0; i < cols.length; i++) o[cols[i]] = r[i]; rows.push(o); });
      loaded++;
      render();
      if (loaded < M.index_shards) next();
    };
    function next() {
      loadScript(index_path(loaded), function () { $("count").textContent = "Cannot load " + index_path(loaded) + "."; });
    }
    function index_path(k) { return "data/rows/" + k + ".js"; }
    render();
    if (M.index_shards) next();
  }

  // ------------------------------------------------------------------------------------- trace
  function labelsOf(d, i, rater) {
    var ls = d.labels[i];
    for (var k = 0; k < ls.length; k++) if (ls[k][0] === rater) return ls[k];
    return null;
  }
  function isDis(d, i) {
    var ls = d.labels[i], seen = {};
    var n = 0;
    ls.forEach(function (l) { if (!seen[l[1]]) { seen[l[1]] = 1; n++; } });
    return n > 1;
  }
  function showDetail(d, i) {
    var box = $("detail"), seg = d.segs[i];
    box.textContent = "";
    box.appendChild(el("h3", null, "Segment " + i + " · chars " + seg[2] + "–" + seg[3] + " · " + seg[1] + " tokens"));
    var ls = d.labels[i];
    if (!ls.length) box.appendChild(el("p", { "class": "muted" }, "No rater labelled this segment."));
    ls.forEach(function (l) {
      var r = S.index.raters[l[0]], item = el("div", { "class": "rater" });
      var head = el("div");
      head.appendChild(el("strong", null, r.name));
      head.appendChild(el("span", { "class": "muted" }, " " + r.source + (r.kind !== r.source ? " · " + r.kind : "") + (l[5] ? " · study " + l[5] : "") + " "));
      head.appendChild(chip(beh(l[1])));
      if (l[2] !== null) head.appendChild(el("span", { "class": "muted" }, " confidence " + fmt(l[2], 2)));
      item.appendChild(head);
      if (l[4]) {
        var dist = el("div", { "class": "dist" });
        l[4].forEach(function (p, k) {
          var row = el("div", { "class": "distrow" });
          row.appendChild(el("span", { "class": "distname" }, beh(k)));
          var bar = el("span", { "class": "distbar lab-" + beh(k) });
          bar.style.width = Math.round(100 * p) + "px";
          row.appendChild(bar);
          row.appendChild(el("span", { "class": "muted" }, " " + fmt(p, 2)));
          dist.appendChild(row);
        });
        item.appendChild(dist);
      }
      if (l[3]) item.appendChild(el("p", { "class": "rationale" }, l[3]));
      box.appendChild(item);
    });
  }
  function pageTrace() {
    var p = params(), n = parseInt(p.t || "0", 10);
    legend("legend");
    loadShard(n, function (d) { renderTrace(d, p); });
  }
  function renderTrace(d, p) {
    document.title = d.id + " · " + document.title;
    $("title").textContent = d.id;
    joined($("meta"), [d.model, d.dataset, d.source, d.n_chars + " characters", d.segs.length + " segments",
      d.correct === null ? null : d.correct ? "answer correct" : "answer wrong"]);
    if (d.problem) { $("problem-box").hidden = false; $("problem").textContent = d.problem; }
    $("answer").textContent = d.answer || "(no final answer)";
    $("gold").textContent = d.gold ? "Reference answer: " + d.gold : "";
    var sel = $("rater");
    d.raters.forEach(function (r) { sel.appendChild(el("option", { value: r }, raterLabel(r))); });
    if (!d.raters.length) sel.appendChild(el("option", { value: "" }, "no labels"));
    var want = p.r !== undefined ? parseInt(p.r, 10) : d.primary;
    if (d.raters.indexOf(want) >= 0) sel.value = String(want);
    var lf = $("label-filter");
    S.index.behaviors.forEach(function (b) { lf.appendChild(el("option", { value: b }, b)); });
    if (p.label) lf.value = p.label;
    if (p.dis) $("dis-only").checked = true;
    if (p.low) $("low-only").checked = true;
    var raterB = d.raters.filter(function (r) { return String(r) !== sel.value; })[0];
    $("compare-link").setAttribute("href", "compare.html" + hash({ t: d.n, a: sel.value, b: raterB === undefined ? "" : raterB }));
    $("compare-link").hidden = d.raters.length < 2;
    // text: gaps as text nodes, segments as spans whose textContent is exactly the segment's text
    var box = $("text"), frag = document.createDocumentFragment(), spans = [];
    for (var i = 0; i < d.segs.length; i++) {
      if (d.gaps[i]) frag.appendChild(document.createTextNode(d.gaps[i]));
      var s = el("span", { "class": "seg", "data-i": i, tabindex: "0" }, d.segs[i][0]);
      spans.push(s);
      frag.appendChild(s);
    }
    if (d.gaps[d.segs.length]) frag.appendChild(document.createTextNode(d.gaps[d.segs.length]));
    box.appendChild(frag);
    function onSeg(e) { var t = e.target.closest ? e.target.closest(".seg") : null; if (t) showDetail(d, parseInt(t.getAttribute("data-i"), 10)); }
    box.addEventListener("mouseover", onSeg);
    box.addEventListener("focusin", onSeg);
    var disIdx = [];
    function apply() {
      var r = sel.value === "" ? null : parseInt(sel.value, 10), lab = lf.value, dis = $("dis-only").checked, low = $("low-only").checked;
      var thr = S.index.low_confidence, shown = 0;
      disIdx = [];
      spans.forEach(function (s, i) {
        var l = r === null ? null : labelsOf(d, i, r), name = l ? beh(l[1]) : null, isd = isDis(d, i);
        var isl = !!(l && l[2] !== null && l[2] < thr);
        s.className = "seg " + (name ? "lab-" + name : "unl") + (isd ? " dis" : "") + (isl ? " low" : "");
        s.setAttribute("data-label", name || "");
        s.setAttribute("data-mark", name ? SHORT[name] : "----");
        s.setAttribute("title", name ? name + (l[2] !== null ? " (" + fmt(l[2], 2) + ")" : "") : "no label");
        var keep = (!lab || name === lab) && (!dis || isd) && (!low || isl);
        if (!keep) s.className += " dim";
        else shown++;
        if (isd) disIdx.push(i);
      });
      $("navhint").textContent = shown + " of " + spans.length + " segments match · " + disIdx.length + " disagreements · keys n / p: next / previous disagreement";
      timeline(d, r);
      analytics(d, r);
    }
    [sel, lf, $("dis-only"), $("low-only")].forEach(function (c) { c.addEventListener("change", apply); });
    apply();
    document.addEventListener("keydown", function (e) {
      if (e.target && /^(INPUT|SELECT|TEXTAREA)$/.test(e.target.tagName)) return;
      if (e.key !== "n" && e.key !== "p" || !disIdx.length) return;
      var cur = document.activeElement && document.activeElement.classList.contains("seg") ? parseInt(document.activeElement.getAttribute("data-i"), 10) : -1;
      var next;
      if (e.key === "n") next = disIdx.filter(function (i) { return i > cur; })[0];
      else next = disIdx.filter(function (i) { return i < cur; }).pop();
      if (next === undefined) next = e.key === "n" ? disIdx[0] : disIdx[disIdx.length - 1];
      spans[next].focus();
      spans[next].scrollIntoView({ block: "center" });
      e.preventDefault();
    });
    if (p.s !== undefined && spans[parseInt(p.s, 10)]) {
      var target = spans[parseInt(p.s, 10)];
      target.classList.add("target");
      target.focus();
      target.scrollIntoView({ block: "center" });
    }
  }
  /* A marker at fraction x of the strip; past 80% its label hangs to the left of its line. */
  function place(m, x) {
    if (x > 0.8) { m.style.right = (100 * (1 - x)) + "%"; m.classList.add("flip"); } else m.style.left = (100 * x) + "%";
  }
  function timeline(d, r) {
    var box = $("timeline"), total = d.n_chars || 1;
    box.textContent = "";
    d.segs.forEach(function (s, i) {
      var l = r === null ? null : labelsOf(d, i, r), name = l ? beh(l[1]) : null;
      var b = el("a", { "class": "tl " + (name ? "lab-" + name : "unl"), href: hash({ t: d.n, s: i, r: r }), title: i + ": " + (name || "no label"), tabindex: "-1" });
      b.style.left = (100 * s[2] / total) + "%";
      b.style.width = Math.max(100 * (s[3] - s[2]) / total, 0.08) + "%";
      b.addEventListener("click", function (e) { e.preventDefault(); var t = document.querySelector('.seg[data-i="' + i + '"]'); if (t) { t.focus(); t.scrollIntoView({ block: "center" }); } });
      box.appendChild(b);
    });
    if (r === d.primary && d.first !== null) {
      var f = d.segs[d.first];
      var m = el("span", { "class": "marker first", title: "first answer (segment " + d.first + ")" }, "first answer");
      place(m, f[2] / total);
      box.appendChild(m);
      d.rounds.forEach(function (i, k) {
        var rm = el("span", { "class": "marker round", title: "re-checking round " + (k + 1) + " (segment " + i + ")" }, "R" + (k + 1));
        place(rm, d.segs[i][2] / total);
        box.appendChild(rm);
      });
    }
  }
  function analytics(d, r) {
    var box = $("analytics"), a = d.analytics;
    box.textContent = "";
    if (!d.raters.length) { box.appendChild(el("p", { "class": "muted" }, "No rater labelled this trace, so there are no tokens per behavior or first-answer analytics. Label it (`ror label`), then build the site again.")); return; }
    if (r !== d.primary) { box.appendChild(el("p", { "class": "muted" }, "Analytics are computed from " + raterName(d.primary) + "'s labels.")); }
    var t = el("table", { "class": "grid small" }), head = el("tr"), row = el("tr");
    S.index.behaviors.forEach(function (b) { head.appendChild(el("th", { "class": "num" }, b)); row.appendChild(el("td", { "class": "num" }, a.tokens_per_behavior[b] || 0)); });
    [["tokens", a.n_tokens], ["first answer at token", a.first_answer_token === null ? "none" : a.first_answer_token + " (" + pct(a.first_answer_fraction) + ")"],
     ["rounds after it", a.recheck_rounds_after_first_answer === null ? "n/a" : a.recheck_rounds_after_first_answer],
     ["flip", a.flip === null ? "n/a" : a.flip ? "yes" : "no"]].forEach(function (kv) { head.appendChild(el("th", null, kv[0])); row.appendChild(el("td", null, kv[1])); });
    var th = el("thead"); th.appendChild(head); t.appendChild(th);
    var tb = el("tbody"); tb.appendChild(row); t.appendChild(tb);
    box.appendChild(el("p", { "class": "muted" }, "Tokens per behavior and first-answer analytics"));
    box.appendChild(t);
  }

  // ------------------------------------------------------------------------------------- compare
  /* Cohen's kappa of two label lists (Cohen 1960): (p_o - p_e) / (1 - p_e); null when p_e = 1. */
  function cohen(pairs, q) {
    var n = pairs.length;
    if (!n) return null;
    var ca = new Array(q).fill(0), cb = new Array(q).fill(0), agree = 0;
    pairs.forEach(function (pr) { ca[pr[0]]++; cb[pr[1]]++; if (pr[0] === pr[1]) agree++; });
    var po = agree / n, pe = 0;
    for (var k = 0; k < q; k++) pe += (ca[k] / n) * (cb[k] / n);
    return pe >= 1 ? null : (po - pe) / (1 - pe);
  }
  function pageCompare() {
    var p = params(), n = parseInt(p.t || "0", 10);
    legend("legend");
    loadShard(n, function (d) {
      $("title").textContent = "Compare raters · " + d.id;
      joined($("meta"), [d.model, d.dataset, d.segs.length + " segments"]);
      $("trace-link").setAttribute("href", "trace.html" + hash({ t: d.n }));
      var A = $("rater-a"), B = $("rater-b");
      if (d.raters.length < 2) {
        // comparing a rater with itself would show 100% and kappa 1: say why there is nothing to compare instead
        $("stats").textContent = (d.raters.length ? "One rater (" + raterName(d.raters[0]) + ") labelled this trace, so there is nothing to compare. Label it with a second judge"
          : "No rater labelled this trace, so there is nothing to compare. Label it with two judges") +
          " (`ror label --judge openai:MODEL`) or pull human labels (`ror review pull`), then build the site again.";
        $("stats").className = "stats muted";
        $("pairs").hidden = true;
        $("legend").hidden = true;
        Array.prototype.forEach.call(document.querySelectorAll(".controls label"), function (c) { c.hidden = true; });
        return;
      }
      d.raters.forEach(function (r) { A.appendChild(el("option", { value: r }, raterLabel(r))); B.appendChild(el("option", { value: r }, raterLabel(r))); });
      A.value = p.a !== undefined && p.a !== "" ? p.a : String(d.raters[0]);
      B.value = p.b !== undefined && p.b !== "" ? p.b : String(d.raters[1] === undefined ? d.raters[0] : d.raters[1]);
      function render() {
        var a = parseInt(A.value, 10), b = parseInt(B.value, 10), only = $("dis-only").checked, pairs = [];
        $("head-a").textContent = "A: " + raterName(a);
        $("head-b").textContent = "B: " + raterName(b);
        var body = $("pairs").tBodies[0], frag = document.createDocumentFragment();
        body.textContent = "";
        d.segs.forEach(function (s, i) {
          var la = labelsOf(d, i, a), lb = labelsOf(d, i, b);
          var dis = !!(la && lb && la[1] !== lb[1]);
          if (la && lb) pairs.push([la[1], lb[1]]);
          if (only && !dis) return;
          var tr = el("tr", { "class": dis ? "dis" : "", "data-i": i });
          var td0 = el("td", { "class": "num" }); td0.appendChild(el("a", { href: "trace.html" + hash({ t: d.n, s: i }) }, i)); tr.appendChild(td0);
          [la, lb].forEach(function (l, k) {
            var td = el("td", { "class": k ? "rb" : "ra" });
            td.appendChild(l ? chip(beh(l[1])) : el("span", { "class": "chip unl", "data-mark": "----" }, "no label"));
            if (l && l[2] !== null) td.appendChild(el("span", { "class": "muted" }, " " + fmt(l[2], 2)));
            tr.appendChild(td);
          });
          tr.appendChild(el("td", { "class": "pre segtext" }, s[0]));
          frag.appendChild(tr);
        });
        body.appendChild(frag);
        var agree = pairs.filter(function (pr) { return pr[0] === pr[1]; }).length;
        var st = $("stats");
        st.textContent = "";
        st.appendChild(el("span", { id: "n-both" }, pairs.length + " segments labelled by both"));
        st.appendChild(document.createTextNode(" · "));
        st.appendChild(el("span", { id: "pct", "data-value": pairs.length ? agree / pairs.length : "" }, "agreement " + (pairs.length ? pct(agree / pairs.length) : "n/a")));
        st.appendChild(document.createTextNode(" · "));
        var k = cohen(pairs, S.index.behaviors.length);
        st.appendChild(el("span", { id: "kappa", "data-value": k === null ? "" : k }, "Cohen's kappa " + fmt(k)));
        st.appendChild(document.createTextNode(" · "));
        st.appendChild(el("span", { id: "n-dis" }, (pairs.length - agree) + " disagreements"));
        history.replaceState(null, "", hash({ t: d.n, a: a, b: b }));
      }
      [A, B, $("dis-only")].forEach(function (c) { c.addEventListener("change", render); });
      render();
    });
  }

  // ------------------------------------------------------------------------------------- dashboard
  var STATS = [["percent_agreement", "percent agreement"], ["fleiss_kappa", "Fleiss' kappa"], ["krippendorff_alpha", "Krippendorff's alpha"], ["gwet_ac1", "Gwet's AC1"]];
  function estCells(tr, est, id) {
    var v = est && est.value !== null && est.value !== undefined;
    tr.appendChild(el("td", { "class": "num stat", "data-stat": id, "data-value": v ? String(est.value) : "" }, v ? fmt(est.value) : "n/a (" + (est ? est.reason : "missing") + ")"));
    tr.appendChild(el("td", { "class": "num" }, v && est.ci_low !== null && est.ci_low !== undefined ? "[" + fmt(est.ci_low) + ", " + fmt(est.ci_high) + "]" : ""));
  }
  function table(id, head, rows) {
    var t = $(id);
    t.textContent = "";
    var th = el("thead"), hr = el("tr");
    head.forEach(function (h) { hr.appendChild(el("th", null, h)); });
    th.appendChild(hr); t.appendChild(th);
    var tb = el("tbody");
    rows.forEach(function (r) { tb.appendChild(r); });
    t.appendChild(tb);
    return t;
  }
  function pageDashboard() {
    var D = S.dashboard, A = D.agreement;
    $("origin").textContent = plural(S.index.n_traces, "trace") + (S.index.origin ? " · " + S.index.origin : "");
    if (!A) {
      // one line says why (one rater: nothing to compare, and what to do); no empty kappa / F1 / confusion panels
      $("agree-missing").hidden = false;
      $("agree-missing").textContent = "No agreement figures: " + (D.agreement_missing || "fewer than two raters.");
      $("agree-figures").hidden = true;
      $("confusion-section").hidden = true;
      if (!Object.keys(D.calibration || {}).length) $("calibration-section").hidden = true;
    } else {
      $("agree-cmd").textContent = "Identical to `" + D.agree_command + "` (also in data/agreement.json): " + plural(A.n_items, "segment") + ", " + A.n_pairable_items + " labelled by two or more, " + plural(A.n_traces, "trace") + ", " + plural(A.n_annotators, "rater") + "." +
        // resampling whole traces from one trace always draws the same trace: every interval is one point
        (A.n_traces < 2 ? " With one trace the trace-level bootstrap intervals have zero width: label more traces for intervals that say something." : "");
      var tok = A.token_weighted || {};
      table("agree-table", ["statistic", "segments", "CI", "tokens", "CI"], STATS.map(function (s) {
        var tr = el("tr"); tr.appendChild(el("th", null, s[1]));
        estCells(tr, A[s[0]], "segment/" + s[0]); estCells(tr, tok[s[0]], "token/" + s[0]);
        return tr;
      }));
      table("kappa-table", ["A", "B", "segments", "kappa", "CI", "compare"], A.cohen_kappa.map(function (k) {
        var tr = el("tr"); tr.appendChild(el("td", null, k.annotator_a)); tr.appendChild(el("td", null, k.annotator_b));
        tr.appendChild(el("td", { "class": "num" }, k.n_items)); estCells(tr, k, "kappa/" + k.annotator_a + "|" + k.annotator_b);
        var td = el("td"), ia = -1, ib = -1;
        S.index.raters.forEach(function (r, i) { if (r.name === k.annotator_a) ia = i; if (r.name === k.annotator_b) ib = i; });
        var first = (D.compare || {})[Math.min(ia, ib) + "," + Math.max(ia, ib)];
        if (first !== undefined) td.appendChild(el("a", { href: "compare.html" + hash({ t: first, a: ia, b: ib }) }, "most disagreements"));
        tr.appendChild(td);
        return tr;
      }));
      var pc = A.per_class && A.per_class.annotators ? A.per_class.annotators : {};
      var names = Object.keys(pc);
      table("f1-table", ["class"].concat(names), A.categories.map(function (c) {
        var tr = el("tr"); tr.appendChild(el("th", null, c));
        names.forEach(function (a) { var e = pc[a].classes[c].f1; tr.appendChild(el("td", { "class": "num stat", "data-stat": "f1/" + a + "/" + c, "data-value": e.value === null ? "" : String(e.value) }, e.value === null ? "n/a" : fmt(e.value))); });
        return tr;
      }).concat([(function () {
        var tr = el("tr"); tr.appendChild(el("th", null, "macro-F1"));
        names.forEach(function (a) { var e = pc[a].macro_f1; tr.appendChild(el("td", { "class": "num stat", "data-stat": "macro_f1/" + a, "data-value": e.value === null ? "" : String(e.value) }, e.value === null ? "n/a" : fmt(e.value) + (e.ci_low !== null ? " [" + fmt(e.ci_low) + ", " + fmt(e.ci_high) + "]" : ""))); });
        return tr;
      })()]));
      $("conf-note").textContent = names.length ? "Rows: the reference (" + (A.per_class.reference === "majority" ? "the majority of the other raters, ties skipped" : A.per_class.reference) + "); columns: the rater. Click a count to list its segments." : "No reference to compare with.";
      names.forEach(function (a) { confusion(a, pc[a].confusion_matrix, A.categories, A.per_class.reference); });
    }
    calibration(D.calibration || {});
    var counts = D.label_counts || [];
    table("dist-table", ["rater", "source"].concat(S.index.behaviors).concat(["total"]), counts.map(function (c) {
      var tr = el("tr"), total = 0;
      S.index.behaviors.forEach(function (b) { total += c.counts[b] || 0; });
      tr.appendChild(el("td", null, c.annotator)); tr.appendChild(el("td", null, c.source));
      S.index.behaviors.forEach(function (b) {
        var v = c.counts[b] || 0, td = el("td", { "class": "num" });
        var bar = el("span", { "class": "minibar lab-" + b }); bar.style.width = (total ? Math.round(60 * v / total) : 0) + "px";
        td.appendChild(bar); td.appendChild(el("span", null, " " + v + " (" + (total ? (100 * v / total).toFixed(0) : 0) + "%)"));
        tr.appendChild(td);
      });
      tr.appendChild(el("td", { "class": "num" }, total));
      return tr;
    }).concat(counts.length ? [] : [(function () { var tr = el("tr"); tr.appendChild(el("td", { colspan: String(S.index.behaviors.length + 3), "class": "muted" }, "No labels yet: label the segments (`ror label`).")); return tr; })()]));
    var ledger = D.ledger || [];
    var sum = { requests: 0, input_tokens: 0, output_tokens: 0, cost_usd: 0 };
    var lrows = ledger.map(function (r) {
      var tr = el("tr");
      // a counter the run recorded as unknown arrives as null: shown "unknown", and the total says so too
      [r.started_at.slice(0, 19).replace("T", " "), r.command, r.status, known(r.labeled), known(r.requests), known(r.cached_responses), known(r.input_tokens), known(r.output_tokens), r.cost_usd === null ? "unknown" : "$" + r.cost_usd.toFixed(4)].forEach(function (v, i) { tr.appendChild(el("td", { "class": i >= 3 ? "num" : "" }, v)); });
      ["requests", "input_tokens", "output_tokens", "cost_usd"].forEach(function (k) { sum[k] = (sum[k] === null || r[k] === null) ? null : sum[k] + r[k]; });
      return tr;
    });
    if (ledger.length) {
      var tot = el("tr", { "class": "total" });
      ["total", "", "", "", known(sum.requests), "", known(sum.input_tokens), known(sum.output_tokens), sum.cost_usd === null ? "unknown" : "$" + sum.cost_usd.toFixed(4)].forEach(function (v, i) { tot.appendChild(el("td", { "class": i >= 3 ? "num" : "" }, v)); });
      lrows.push(tot);
    } else {
      var none = el("tr"); none.appendChild(el("td", { colspan: "9", "class": "muted" }, "No judge run made requests (the offline baseline costs nothing).")); lrows.push(none);
    }
    table("ledger", ["started (UTC)", "command", "status", "labelled", "requests", "cached", "input tokens", "output tokens", "cost"], lrows);
    var rev = D.review || [];
    table("review", ["study", "annotator", "role", "assigned", "labelled", "skipped", "rejected", "remaining", "progress"], rev.length ? rev.map(function (r) {
      var tr = el("tr");
      [r.study, r.annotator, r.role, r.assigned, r.labeled, r.skipped, r.rejected, r.remaining].forEach(function (v, i) { tr.appendChild(el("td", { "class": i >= 3 ? "num" : "" }, v)); });
      var td = el("td"), prog = el("progress", { max: String(r.assigned || 1), value: String(r.labeled + r.skipped) });
      td.appendChild(prog); td.appendChild(el("span", null, " " + (r.assigned ? pct((r.labeled + r.skipped) / r.assigned) : "n/a"))); tr.appendChild(td);
      return tr;
    }) : [(function () { var tr = el("tr"); tr.appendChild(el("td", { colspan: "9", "class": "muted" }, "No review study in this store.")); return tr; })()]);
  }
  function confusion(a, m, cats, ref) {
    var card = el("div", { "class": "card" });
    card.appendChild(el("h3", null, a + " vs " + (ref === "majority" ? "the majority of the other raters" : ref)));
    var t = el("table", { "class": "grid confusion", "data-annotator": a });
    var hr = el("tr"); hr.appendChild(el("th", null, "ref \\ rater"));
    cats.forEach(function (c) { hr.appendChild(el("th", { "class": "num" }, SHORT[c] || c)); });
    var th = el("thead"); th.appendChild(hr); t.appendChild(th);
    var tb = el("tbody"), max = 0;
    m.forEach(function (row) { row.forEach(function (v) { if (v > max) max = v; }); });
    m.forEach(function (row, r) {
      var tr = el("tr"); tr.appendChild(el("th", null, cats[r]));
      row.forEach(function (v, c) {
        var td = el("td", { "class": "num" + (r === c ? " diag" : ""), "data-r": r, "data-c": c, "data-value": String(v) });
        td.style.setProperty("--heat", max ? (v / max).toFixed(3) : "0");
        if (v) td.appendChild(el("a", { href: "cell.html" + hash({ a: a, r: r, c: c }) }, v)); else td.textContent = "0";
        tr.appendChild(td);
      });
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    card.appendChild(t);
    $("confusion").appendChild(card);
  }
  function calibration(cal) {
    var box = $("calibration"), NS = "http://www.w3.org/2000/svg";
    var keys = Object.keys(cal);
    if (!keys.length) { box.appendChild(el("p", { "class": "muted" }, "No rater stored confidences on segments that other raters labelled too.")); return; }
    keys.forEach(function (k) {
      var bins = cal[k], card = el("div", { "class": "card" });
      card.appendChild(el("h3", null, raterName(parseInt(k, 10))));
      var W = 240, H = 240, P = 30, svg = document.createElementNS(NS, "svg");
      svg.setAttribute("viewBox", "0 0 " + W + " " + H); svg.setAttribute("width", W); svg.setAttribute("height", H);
      svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "reliability diagram of " + raterName(parseInt(k, 10)));
      function line(x1, y1, x2, y2, cls) { var l = document.createElementNS(NS, "line"); l.setAttribute("x1", x1); l.setAttribute("y1", y1); l.setAttribute("x2", x2); l.setAttribute("y2", y2); l.setAttribute("class", cls); svg.appendChild(l); }
      function text(x, y, s) { var t = document.createElementNS(NS, "text"); t.setAttribute("x", x); t.setAttribute("y", y); t.textContent = s; svg.appendChild(t); }
      var iw = W - 2 * P, ih = H - 2 * P;
      line(P, H - P, W - P, H - P, "axis"); line(P, H - P, P, P, "axis"); line(P, H - P, W - P, P, "diag");
      text(P - 4, H - P + 14, "0"); text(W - P - 4, H - P + 14, "1"); text(W / 2 - 26, H - 6, "confidence");
      text(P - 12, P + 4, "1"); text(2, P - 12, "accuracy");
      var rows = [];
      bins.forEach(function (b, i) {
        if (!b.n) return;
        var acc = b.correct / b.n, bw = iw / 10;
        var rect = document.createElementNS(NS, "rect");
        rect.setAttribute("x", P + i * bw + 1); rect.setAttribute("width", bw - 2);
        rect.setAttribute("y", H - P - acc * ih); rect.setAttribute("height", acc * ih); rect.setAttribute("class", "calbar");
        var title = document.createElementNS(NS, "title"); title.textContent = (i / 10).toFixed(1) + "–" + ((i + 1) / 10).toFixed(1) + ": accuracy " + acc.toFixed(3) + " of " + b.n;
        rect.appendChild(title); svg.appendChild(rect);
        rows.push((i / 10).toFixed(1) + "–" + ((i + 1) / 10).toFixed(1) + ": " + acc.toFixed(2) + " (n=" + b.n + ")");
      });
      card.appendChild(svg);
      card.appendChild(el("p", { "class": "muted small" }, rows.join(" · ")));
      box.appendChild(card);
    });
  }

  // ------------------------------------------------------------------------------------- cell
  function pageCell() {
    // The cell's segments are in their own file, data/cells/<rater>/<r>_<c>.js (loaded only here).
    var p = params(), cats = S.index.behaviors, r = parseInt(p.r, 10), c = parseInt(p.c, 10), ri = -1;
    S.index.raters.forEach(function (x, i) { if (x.name === p.a) ri = i; });
    $("title").textContent = "Reference " + cats[r] + ", " + p.a + " said " + cats[c];
    function none() { $("meta").textContent = "No segment in this cell."; }
    if (ri < 0 || !(r >= 0 && r < cats.length) || !(c >= 0 && c < cats.length)) return none();
    S.onCell = function (cell) {
      $("meta").textContent = cell.n + " segments" + (cell.items.length < cell.n ? " (first " + cell.items.length + " listed)" : "");
      var body = $("cell-items").tBodies[0], frag = document.createDocumentFragment();
      cell.items.forEach(function (it) {
        var tr = el("tr"), td = el("td");
        td.appendChild(el("a", { href: "trace.html" + hash({ t: it[3], s: it[1], r: ri }) }, it[0]));
        tr.appendChild(td);
        tr.appendChild(el("td", { "class": "num" }, it[1]));
        tr.appendChild(el("td", { "class": "pre segtext" }, it[2]));
        frag.appendChild(tr);
      });
      body.appendChild(frag);
    };
    loadScript("data/cells/" + ri + "/" + r + "_" + c + ".js", none);
  }

  var PAGES = { index: pageIndex, trace: pageTrace, compare: pageCompare, dashboard: pageDashboard, cell: pageCell };
  function maybeStart() {
    var page = document.body.getAttribute("data-page");
    if (!S.index) return;
    if (page === "dashboard" && !S.dashboard) return;
    if (S.started) return;
    S.started = true;
    PAGES[page]();
  }
  window.addEventListener("hashchange", function () { var pg = document.body.getAttribute("data-page"); if (pg === "trace" || pg === "compare" || pg === "cell") location.reload(); });
  return {
    index: function (d) { S.index = d; maybeStart(); },
    dashboard: function (d) { S.dashboard = d; maybeStart(); },
    rows: function (d) { if (S.onRows) S.onRows(d); },
    cell: function (d) { if (S.onCell) S.onCell(d); },
    shard: function (d) {
      S.shards[d.n] = d;
      (S.waiting[d.n] || []).forEach(function (f) { f(d); });
      S.waiting[d.n] = [];
    }
  };
})();
