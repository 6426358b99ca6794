// The sandbox preview: draws every card the sandbox holds (Feishu card JSON 2.0) as the Feishu client
// would, closely enough to judge layout, keeps them live over Server-Sent Events, and turns clicks into
// card.action.trigger callbacks (sent by the server, signed like Feishu's).
//
// Card text is untrusted. Nothing here ever assigns HTML: every node is built with createElement and
// every text goes in through createTextNode / textContent. Links are http(s) only.
"use strict";

(() => {
  const API = "/sandbox/api";
  const IMAGES = "/sandbox/images/";
  const TOAST_MS = 4000;
  const STREAM_ANIMATION_MS = 800; // CardKit typing: an appended text is typed out within this time
  const COLOURS = new Set([
    "neutral", "blue", "turquoise", "lime", "orange", "violet", "indigo", "wathet", "green", "yellow",
    "red", "purple", "carmine", "grey", "gray",
  ]);
  const TEMPLATES = new Set([
    "blue", "wathet", "turquoise", "green", "yellow", "orange", "red", "carmine", "violet", "purple",
    "indigo", "grey", "default",
  ]);
  const BUTTON_TYPES = new Set([
    "default", "primary", "danger", "text", "primary_text", "danger_text", "primary_filled", "danger_filled",
    "laser",
  ]);
  const NAMED_ENTITIES = {
    amp: "&", lt: "<", gt: ">", quot: "\"", apos: "'", nbsp: "\u00a0", sim: "~", ensp: "\u2002",
    emsp: "\u2003", thinsp: "\u2009", middot: "·", hellip: "…", mdash: "—", ndash: "–", copy: "©",
  };

  const page = {
    messages: new Map(), // message_id -> the server's view of the message
    nodes: new Map(), // message_id -> its bubble element
    answers: new Map(), // message_id -> {card, updates}: a card from a callback answer, until the next update
    locales: new Map(), // message_id -> the locale picked in its switch
    panels: new Map(), // message_id|path -> open (the user's toggle wins over the JSON while the page lives)
    fields: new Map(), // message_id|field name -> what the user typed or picked
    streamed: new Map(), // message_id|element_id -> the last streamed text drawn
    hidden: 0,
    openMenu: null, // message_id|field name of the multi-select whose menu is open
  };

  const $ = (id) => document.getElementById(id);

  // --- DOM and text helpers ----------------------------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function validCodePoint(code) {
    return Number.isInteger(code) && code > 0 && code <= 0x10ffff && !(code >= 0xd800 && code <= 0xdfff);
  }

  // Our cards carry numeric entities (&#42;) for characters that must not be markup: decode them to text.
  function decodeEntities(raw) {
    return String(raw).replace(/&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});/g, (all, body) => {
      if (body[0] === "#") {
        const hex = body[1] === "x" || body[1] === "X";
        const code = hex ? parseInt(body.slice(2), 16) : parseInt(body.slice(1), 10);
        return validCodePoint(code) ? String.fromCodePoint(code) : all;
      }
      return Object.prototype.hasOwnProperty.call(NAMED_ENTITIES, body) ? NAMED_ENTITIES[body] : all;
    });
  }

  function text(raw) {
    return document.createTextNode(decodeEntities(raw));
  }

  function safeUrl(raw) {
    const candidate = decodeEntities(String(raw || "")).trim();
    if (!/^https?:\/\//i.test(candidate)) return null;
    try {
      const url = new URL(candidate);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (_error) {
      return null;
    }
  }

  function link(url, children) {
    const anchor = el("a", "link");
    anchor.href = url;
    anchor.target = "_blank";
    anchor.rel = "noopener noreferrer";
    anchor.append(...children);
    return anchor;
  }

  function openUrl(raw) {
    const url = safeUrl(raw);
    if (url) window.open(url, "_blank", "noopener,noreferrer");
    else toast("warning", `not opened: only http(s) links are allowed (${String(raw).slice(0, 80)})`);
  }

  function colourClass(prefix, colour) {
    const name = String(colour || "").toLowerCase();
    return COLOURS.has(name) ? `${prefix}-${name}` : "";
  }

  function setMargin(node, margin) {
    if (typeof margin === "string" && /^(-?\d{1,2}px)( -?\d{1,2}px){0,3}$/.test(margin.trim())) {
      node.style.margin = margin.trim();
    }
  }

  // A text object ({content, i18n_content}) in the picked locale, else its default content.
  function pick(textObj, locale) {
    if (textObj === null || textObj === undefined) return "";
    if (typeof textObj === "string") return textObj;
    const i18n = textObj.i18n_content;
    if (locale && i18n && typeof i18n === "object" && typeof i18n[locale] === "string") return i18n[locale];
    return typeof textObj.content === "string" ? textObj.content : "";
  }

  // --- markdown: blocks --------------------------------------------------------------------------

  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}(?:([-*_])\s*(?:\1\s*){2,}|<hr\s*\/?>)\s*$/i;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const DELIMITER_ROW = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function renderMarkdown(source, ctx) {
    const root = el("div", "md");
    appendBlocks(root, String(source || "").replace(/\r\n?/g, "\n").split("\n"), ctx);
    return root;
  }

  function appendBlocks(root, lines, ctx) {
    let paragraph = [];
    const flush = () => {
      if (paragraph.length) root.append(renderParagraph(paragraph, ctx));
      paragraph = [];
    };
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const block = blockAt(lines, i, ctx);
      if (block) {
        flush();
        if (block.node) root.append(block.node);
        i = block.next;
      } else if (/^\s*$/.test(line)) {
        flush();
        i += 1;
      } else {
        paragraph.push(line);
        i += 1;
      }
    }
    flush();
  }

  function blockAt(lines, i, ctx) {
    const line = lines[i];
    if (FENCE.test(line)) return fencedCode(lines, i);
    let match = HEADING.exec(line);
    if (match) {
      const heading = el(`h${match[1].length}`);
      heading.append(renderInline(match[2], ctx));
      return { node: heading, next: i + 1 };
    }
    if (RULE.test(line)) return { node: el("hr"), next: i + 1 };
    if (QUOTE.test(line)) return quote(lines, i, ctx);
    if (ITEM.test(line)) return list(lines, i, ctx);
    if (line.includes("|") && i + 1 < lines.length && DELIMITER_ROW.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      return table(lines, i, ctx);
    }
    return null;
  }

  function fencedCode(lines, start) {
    const fence = FENCE.exec(lines[start])[1];
    const body = [];
    let i = start + 1;
    while (i < lines.length && !(lines[i].trim().startsWith(fence[0].repeat(fence.length)) && FENCE.test(lines[i]))) {
      body.push(lines[i]);
      i += 1;
    }
    const pre = el("pre");
    const code = el("code");
    code.append(text(body.join("\n")));
    pre.append(code);
    return { node: pre, next: Math.min(i + 1, lines.length) };
  }

  function quote(lines, start, ctx) {
    const inner = [];
    let i = start;
    while (i < lines.length && QUOTE.test(lines[i])) {
      inner.push(QUOTE.exec(lines[i])[1]);
      i += 1;
    }
    const node = el("blockquote");
    appendBlocks(node, inner, ctx);
    return { node, next: i };
  }

  function indentOf(spaces) {
    return spaces.replace(/\t/g, "    ").length;
  }

  // Nested lists by indentation (Feishu: 4 spaces a level; 2 are accepted too).
  function list(lines, start, ctx) {
    const out = document.createDocumentFragment();
    const stack = []; // {indent, ordered, node: the list, item: its last li}
    let i = start;
    while (i < lines.length) {
      const match = ITEM.exec(lines[i]);
      const top = stack[stack.length - 1];
      if (!match) {
        if (!top || !/^\s+\S/.test(lines[i])) break;
        top.item.append(el("br"), renderInline(lines[i].trim(), ctx)); // an indented continuation line
        i += 1;
        continue;
      }
      listItem(stack, out, indentOf(match[1]), match[2], renderInline(match[3], ctx));
      i += 1;
    }
    return { node: out, next: i };
  }

  function listItem(stack, out, indent, marker, content) {
    const ordered = /\d/.test(marker);
    while (stack.length && indent < stack[stack.length - 1].indent) stack.pop();
    if (stack.length && indent === stack[stack.length - 1].indent && ordered !== stack[stack.length - 1].ordered) {
      stack.pop(); // another kind of list at the same level: a new list
    }
    let top = stack[stack.length - 1];
    if (!top || indent > top.indent) {
      const node = el(ordered ? "ol" : "ul");
      if (ordered) node.start = parseInt(marker, 10);
      (top ? top.item : out).append(node);
      top = { indent, ordered, node, item: null };
      stack.push(top);
    }
    top.item = el("li");
    top.item.append(content);
    top.node.append(top.item);
  }

  function splitRow(line) {
    let row = line.trim();
    if (row.startsWith("|")) row = row.slice(1);
    if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
    return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
  }

  function table(lines, start, ctx) {
    const node = el("table");
    const head = el("tr");
    for (const cell of splitRow(lines[start])) {
      const th = el("th");
      th.append(renderInline(cell, ctx));
      head.append(th);
    }
    node.append(head);
    let i = start + 2;
    while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
      const row = el("tr");
      for (const cell of splitRow(lines[i])) {
        const td = el("td");
        td.append(renderInline(cell, ctx));
        row.append(td);
      }
      node.append(row);
      i += 1;
    }
    return { node, next: i };
  }

  function renderParagraph(lines, ctx) {
    const paragraph = el("p");
    paragraph.append(renderInline(lines.join("\n"), ctx));
    return paragraph;
  }

  // --- markdown: inline --------------------------------------------------------------------------

  const ESCAPABLE = /[\\`*_{}[\]()#+\-.!|~<>]/;
  const LINK = /\[((?:[^[\]\n]|\[[^[\]\n]*\])*)\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"\n]*")?\s*\)/y;
  const IMAGE = /!\[([^[\]\n]*)\]\(\s*([^()\s]+)\s*\)/y;
  const BARE_URL = /https?:\/\/[^\s<>"'()\u3000-\u303f\uff00-\uffef]+/y;
  const TAG = /<([A-Za-z_]+)((?:\s+[A-Za-z_:-]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'>]+))?)*)\s*(\/?)>/y;
  const ATTR = /([A-Za-z_:-]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+)))?/g;

  function renderInline(source, ctx) {
    const out = document.createDocumentFragment();
    let buffer = "";
    const flush = () => {
      if (buffer) out.append(text(buffer));
      buffer = "";
    };
    let i = 0;
    while (i < source.length) {
      const found = inlineAt(source, i, ctx);
      if (found) {
        flush();
        out.append(found.node);
        i = found.end;
      } else {
        buffer += source[i];
        i += 1;
      }
    }
    flush();
    return out;
  }

  function inlineAt(source, i, ctx) {
    const c = source[i];
    if (c === "\\" && ESCAPABLE.test(source[i + 1] || "")) {
      return { node: document.createTextNode(source[i + 1]), end: i + 2 };
    }
    if (c === "\n") return { node: el("br"), end: i + 1 };
    if (c === "`") return codeSpan(source, i);
    if (c === "*" || c === "_" || c === "~") return emphasis(source, i, ctx);
    if (c === "!" && source[i + 1] === "[") return markdownImage(source, i, ctx);
    if (c === "[") return markdownLink(source, i, ctx);
    if (c === "<") return htmlTag(source, i, ctx);
    if (c === "h" && (i === 0 || /[\s(（:：]/.test(source[i - 1]))) return bareUrl(source, i);
    return null;
  }

  function codeSpan(source, i) {
    let ticks = 1;
    while (source[i + ticks] === "`") ticks += 1;
    const fence = "`".repeat(ticks);
    const end = source.indexOf(fence, i + ticks);
    if (end < 0) return null;
    return { node: el("code", "", decodeEntities(source.slice(i + ticks, end))), end: end + ticks };
  }

  const WORD = /[\p{L}\p{N}]/u;

  // Emphasis as CommonMark pairs it: an opener is followed by a non-space, a closer follows one, and
  // underscores never open or close inside a word (snake_case and __dunder__ names stay text).
  function emphasis(source, i, ctx) {
    const pairs = [["**", "strong"], ["__", "strong"], ["~~", "del"], ["*", "em"]];
    for (const [marker, tag] of pairs) {
      if (!source.startsWith(marker, i)) continue;
      const from = i + marker.length;
      const underscore = marker[0] === "_";
      if (/\s/.test(source[from] || " ") || (underscore && WORD.test(source[i - 1] || ""))) continue;
      const end = closer(source, marker, from + 1, underscore);
      if (end < 0) continue;
      const node = el(tag);
      node.append(renderInline(source.slice(from, end), ctx));
      return { node, end: end + marker.length };
    }
    return null;
  }

  function closer(source, marker, from, underscore) {
    for (let end = source.indexOf(marker, from); end >= 0; end = source.indexOf(marker, end + 1)) {
      const single = marker === "*" && (source[end + 1] === "*" || source[end - 1] === "*");
      const spaced = /\s/.test(source[end - 1]);
      const inWord = underscore && WORD.test(source[end + marker.length] || "");
      if (!single && !spaced && !inWord) return end;
    }
    return -1;
  }

  function markdownLink(source, i, ctx) {
    LINK.lastIndex = i;
    const match = LINK.exec(source);
    if (!match) return null;
    const url = safeUrl(match[2]);
    if (!url) return null; // not http(s): shown as the text it is
    return { node: link(url, [renderInline(match[1], ctx)]), end: LINK.lastIndex };
  }

  function bareUrl(source, i) {
    BARE_URL.lastIndex = i;
    const match = BARE_URL.exec(source);
    if (!match) return null;
    const raw = match[0].replace(/[.,;:!?。，；：！？]+$/, "");
    const url = safeUrl(raw);
    return url ? { node: link(url, [text(raw)]), end: i + raw.length } : null;
  }

  function markdownImage(source, i, ctx) {
    IMAGE.lastIndex = i;
    const match = IMAGE.exec(source);
    if (!match) return null;
    return { node: image(decodeEntities(match[2]), ctx, "img"), end: IMAGE.lastIndex };
  }

  function attributes(raw) {
    const attrs = {};
    for (const match of String(raw || "").matchAll(ATTR)) {
      attrs[match[1].toLowerCase()] = match[2] ?? match[3] ?? match[4] ?? "";
    }
    return attrs;
  }

  // The end of the element opened before `from`: its matching close tag (same-name tags may nest).
  function closing(source, from, name) {
    const pattern = new RegExp(`<(/?)${name}\\b[^>]*>`, "gi");
    pattern.lastIndex = from;
    let depth = 1;
    for (let match = pattern.exec(source); match; match = pattern.exec(source)) {
      depth += match[1] ? -1 : 1;
      if (depth === 0) return { start: match.index, end: pattern.lastIndex };
    }
    return null;
  }

  // The tags Feishu markdown understands. Any other tag (and any tag we cannot close) stays text.
  function htmlTag(source, i, ctx) {
    TAG.lastIndex = i;
    const match = TAG.exec(source);
    if (!match) return null;
    const name = match[1].toLowerCase();
    const attrs = attributes(match[2]);
    const after = TAG.lastIndex;
    if (name === "br") return { node: el("br"), end: after };
    if (name === "hr") return { node: el("hr"), end: after };
    const draw = TAG_RENDERERS[name];
    if (!draw) return null;
    const close = match[3] ? null : closing(source, after, name);
    if (!close && !["at", "person", "local_datetime"].includes(name)) return null;
    const inner = close ? source.slice(after, close.start) : "";
    return { node: draw(attrs, inner, ctx), end: close ? close.end : after };
  }

  function mentionChip(label) {
    return el("span", "mention", `@${label}`);
  }

  const TAG_RENDERERS = {
    font(attrs, inner, ctx) {
      const span = el("span", colourClass("fc", attrs.color));
      if (/^#[0-9a-fA-F]{3,8}$/.test(attrs.color || "")) span.style.color = attrs.color;
      span.append(renderInline(inner, ctx));
      return span;
    },
    text_tag(attrs, inner) {
      return el("span", `tag ${colourClass("tag", attrs.color) || "tag-blue"}`, decodeEntities(inner));
    },
    a(attrs, inner, ctx) {
      const url = safeUrl(attrs.href);
      return url ? link(url, [renderInline(inner, ctx)]) : renderInline(inner, ctx);
    },
    link(attrs, inner, ctx) {
      const url = safeUrl(attrs.url || attrs.pc_url);
      return url ? link(url, [renderInline(inner, ctx)]) : renderInline(inner, ctx);
    },
    at(attrs, inner) {
      const label = decodeEntities(inner).trim();
      if (attrs.id === "all") return mentionChip(label || "all");
      const ids = attrs.ids ? attrs.ids.split(",") : [attrs.id || attrs.email || attrs.user_id || "?"];
      const out = document.createDocumentFragment();
      ids.forEach((id, index) => out.append(mentionChip(label && index === 0 ? label : decodeEntities(id.trim()))));
      return out;
    },
    person(attrs, inner) {
      return mentionChip(decodeEntities(inner).trim() || decodeEntities(attrs.id || "?"));
    },
    raw(_attrs, inner) {
      return text(inner);
    },
    number_tag(attrs, inner) {
      return el("span", `tag ${colourClass("tag", attrs.background_color) || "tag-neutral"}`, decodeEntities(inner));
    },
    local_datetime(attrs) {
      const millis = Number(attrs.millisecond);
      const when = Number.isFinite(millis) && millis > 0 ? new Date(millis) : new Date();
      return el("span", "", when.toLocaleString());
    },
  };

  // --- card elements -----------------------------------------------------------------------------

  function renderElements(elements, ctx, path) {
    const nodes = [];
    (Array.isArray(elements) ? elements : []).forEach((element, index) => {
      nodes.push(renderElement(element, { ...ctx, path: `${path}.${index}` }));
    });
    return nodes;
  }

  function renderElement(element, ctx) {
    if (!element || typeof element !== "object") return el("div", "unknown", "[not an element]");
    const draw = ELEMENTS[element.tag];
    try {
      const node = draw ? draw(element, ctx) : el("div", "unknown", `[${String(element.tag)}: not drawn by the preview]`);
      setMargin(node, element.margin);
      return node;
    } catch (error) {
      console.warn("preview: could not draw", element.tag, error);
      return el("div", "render-error", `[${String(element.tag)}: could not be drawn]`);
    }
  }

  function textBlock(textObj, ctx, className) {
    const content = pick(textObj, ctx.locale);
    const isMarkdown = textObj && (textObj.tag === "lark_md" || textObj.tag === "markdown");
    const node = isMarkdown ? renderMarkdown(content, ctx) : el("div", "plain", decodeEntities(content));
    if (className) node.classList.add(className);
    return node;
  }

  function alignAndSize(node, element) {
    const align = element.text_align;
    if (align === "center" || align === "right") node.classList.add(`text-${align}`);
    const size = String(element.text_size || "");
    if (size === "notation" || size.startsWith("x-small") || size === "small") node.classList.add("size-notation");
    if (size.startsWith("heading")) node.classList.add("size-heading");
  }

  function streamingText(element, ctx) {
    const content = pick(element, ctx.locale);
    const key = element.element_id ? `${ctx.message.message_id}|${element.element_id}` : null;
    const node = el("div");
    const before = key ? page.streamed.get(key) : undefined;
    if (key) page.streamed.set(key, content);
    if (ctx.streaming && key) node.classList.add("streaming");
    const draw = (shown) => node.replaceChildren(renderMarkdown(shown, ctx));
    if (ctx.streaming && typeof before === "string" && content.startsWith(before) && content.length > before.length) {
      typeOut(draw, before, content);
    } else {
      draw(content);
    }
    return node;
  }

  // CardKit streaming: text that extends what was shown is typed out, as the Feishu client does.
  function typeOut(draw, before, full) {
    const extra = full.length - before.length;
    const steps = Math.max(1, Math.min(extra, 20));
    let step = 0;
    draw(before);
    const timer = setInterval(() => {
      step += 1;
      draw(full.slice(0, before.length + Math.ceil((extra * step) / steps)));
      if (step >= steps) clearInterval(timer);
    }, STREAM_ANIMATION_MS / steps);
  }

  function markdownElement(element, ctx) {
    const node = element.element_id ? streamingText(element, ctx) : renderMarkdown(pick(element, ctx.locale), ctx);
    alignAndSize(node, element);
    return node;
  }

  function divElement(element, ctx) {
    const node = el("div");
    if (element.text) {
      const block = textBlock(element.text, ctx);
      alignAndSize(block, element.text);
      const colour = colourClass("fc", element.text.text_color);
      if (colour) block.classList.add(colour);
      node.append(block);
    }
    for (const field of Array.isArray(element.fields) ? element.fields : []) {
      if (field && field.text) node.append(textBlock(field.text, ctx));
    }
    return node;
  }

  function columnSet(element, ctx) {
    const node = el("div", "columns");
    const mode = element.flex_mode || "none";
    if (mode === "flow") node.classList.add("flow");
    const columns = Array.isArray(element.columns) ? element.columns : [];
    if (columns.every((column) => (column.width || "auto") === "auto")) node.classList.add("auto-wrap");
    setGap(node, element.horizontal_spacing);
    if (element.background_style && element.background_style !== "default") node.classList.add("bg-grey");
    columns.forEach((column, index) => node.append(columnElement(column, mode, ctx, `${ctx.path}.c${index}`)));
    return node;
  }

  function columnElement(column, mode, ctx, path) {
    const node = el("div", "column");
    const width = String(column.width || "auto");
    if (mode === "bisect" || mode === "trisect" || mode === "stretch" || width === "weighted") {
      node.classList.add("weighted");
      node.style.flexGrow = String(Math.min(Math.max(Number(column.weight) || 1, 1), 5));
    } else if (/^\d{2,3}px$/.test(width)) {
      node.style.flex = `0 0 ${width}`;
    } else {
      node.classList.add("auto");
    }
    if (column.vertical_align === "center" || column.vertical_align === "bottom") {
      node.classList.add(`valign-${column.vertical_align}`);
    }
    if (column.background_style && column.background_style !== "default") node.classList.add("bg-grey");
    setGap(node, column.vertical_spacing, "rowGap");
    node.append(...renderElements(column.elements, ctx, path));
    return node;
  }

  const SPACING = { small: "4px", medium: "8px", large: "12px", extra_large: "16px" };

  function setGap(node, spacing, property = "columnGap") {
    const value = SPACING[spacing] || (/^\d{1,2}px$/.test(String(spacing || "")) ? spacing : null);
    if (value) node.style[property] = value;
  }

  function collapsiblePanel(element, ctx) {
    const node = el("details", "panel");
    const key = `${ctx.message.message_id}|${element.element_id || ctx.path}`;
    node.open = page.panels.has(key) ? page.panels.get(key) : Boolean(element.expanded);
    node.addEventListener("toggle", () => page.panels.set(key, node.open));
    const summary = el("summary");
    const header = element.header || {};
    summary.append(textBlock(header.title || {}, ctx));
    const body = el("div", "panel-body");
    body.append(...renderElements(element.elements, ctx, ctx.path));
    node.append(summary, body);
    return node;
  }

  function image(key, ctx, className) {
    const known = ctx.message.images && ctx.message.images[key];
    const missing = () => el("div", "img-missing", `image ${key}`);
    if (!known) return missing();
    const img = el("img", className);
    img.alt = key;
    img.loading = "lazy";
    img.addEventListener("error", () => img.replaceWith(missing()));
    img.src = IMAGES + encodeURIComponent(key);
    return img;
  }

  function imgElement(element, ctx) {
    const key = (element.i18n_img_key && element.i18n_img_key[ctx.locale]) || element.img_key;
    const node = image(String(key || ""), ctx, "img");
    const alt = pick(element.alt, ctx.locale);
    if (alt && node.tagName === "IMG") node.alt = decodeEntities(alt);
    return node;
  }

  function imgCombination(element, ctx) {
    const mode = ["double", "triple", "bisect", "trisect"].includes(element.combination_mode)
      ? element.combination_mode : "bisect";
    const shown = { double: 2, triple: 3, bisect: 6, trisect: 9 }[mode];
    const node = el("div", `img-grid ${mode}`);
    for (const item of (Array.isArray(element.img_list) ? element.img_list : []).slice(0, shown)) {
      node.append(image(String(item.img_key || ""), ctx, "img"));
    }
    return node;
  }

  function person(element) {
    return mentionChip(String(element.user_id || "?"));
  }

  function personList(element) {
    const node = el("div");
    for (const one of Array.isArray(element.persons) ? element.persons : []) node.append(mentionChip(String(one.id || "?")), " ");
    return node;
  }

  function hr() {
    return el("hr", "hr");
  }

  // --- interactive elements ------------------------------------------------------------------------

  function fieldKey(ctx, name) {
    return `${ctx.message.message_id}|${name}`;
  }

  function remember(ctx, name, value) {
    if (name) page.fields.set(fieldKey(ctx, name), value);
  }

  function recalled(ctx, name, fallback) {
    const key = fieldKey(ctx, name);
    return name && page.fields.has(key) ? page.fields.get(key) : fallback;
  }

  function buttonElement(element, ctx) {
    const kind = BUTTON_TYPES.has(element.type) ? element.type : "default";
    const node = el("button", `btn btn-${kind}`, decodeEntities(pick(element.text, ctx.locale)));
    node.type = "button";
    if (["tiny", "small", "large"].includes(element.size)) node.classList.add(`btn-${element.size}`);
    if (element.width === "fill") node.classList.add("fill");
    node.disabled = Boolean(element.disabled) || ctx.message.recalled || ctx.message.deleted;
    if (element.disabled && element.disabled_tips) node.title = decodeEntities(pick(element.disabled_tips, ctx.locale));
    if (element.hover_tips) node.title = decodeEntities(pick(element.hover_tips, ctx.locale));
    node.addEventListener("click", (event) => {
      event.stopPropagation();
      onButton(element, ctx, node).catch((error) => toast("error", `click failed: ${error.message}`));
    });
    return node;
  }

  async function onButton(element, ctx, node) {
    if (element.confirm && !(await confirmDialog(element.confirm, ctx.locale))) return;
    if (ctx.form && element.form_action_type === "reset") {
      ctx.form.reset();
      return;
    }
    if (ctx.form && (element.form_action_type === "submit" || element.action_type === "form_submit")) {
      await ctx.form.submit(element, node);
      return;
    }
    const behaviors = Array.isArray(element.behaviors) ? element.behaviors : [];
    for (const behavior of behaviors) {
      if (behavior && behavior.type === "open_url") openUrl(behavior.pc_url || behavior.default_url);
    }
    const callback = behaviors.find((behavior) => behavior && behavior.type === "callback");
    const value = callback ? callback.value : element.value; // `value` is the historical place
    if (callback || (element.value && typeof element.value === "object")) {
      await click(ctx, { value, button_name: element.name || null }, node);
    } else if (element.url) {
      openUrl(element.url);
    }
  }

  function inputElement(element, ctx) {
    const multiline = element.input_type === "multiline_text";
    const node = el(multiline ? "textarea" : "input", "field");
    if (multiline) node.rows = Math.min(Math.max(Number(element.rows) || 5, 1), 20);
    else node.type = element.input_type === "password" ? "password" : "text";
    if (element.width === "fill" || !element.width) node.classList.add("fill");
    node.placeholder = decodeEntities(pick(element.placeholder, ctx.locale));
    const max = Number(element.max_length);
    if (max > 0) node.maxLength = Math.min(max, 1000);
    node.disabled = Boolean(element.disabled);
    const initial = pick({ content: element.default_value, i18n_content: element.i18n_default_value }, ctx.locale);
    node.value = recalled(ctx, element.name, decodeEntities(initial || ""));
    node.addEventListener("input", () => {
      node.classList.remove("invalid");
      remember(ctx, element.name, node.value);
    });
    if (ctx.form && element.name) ctx.form.add(element.name, Boolean(element.required), node, () => node.value);
    return labelled(element, ctx, node);
  }

  function labelled(element, ctx, field) {
    if (!element.label) return field;
    const wrap = el("div", `field-wrap ${element.label_position === "left" ? "label-left" : ""}`);
    wrap.append(textBlock(element.label, ctx, "field-label"), field);
    return wrap;
  }

  function options(element) {
    return (Array.isArray(element.options) ? element.options : []).filter((option) => option && "value" in option);
  }

  function selectStatic(element, ctx) {
    const node = el("select", "field");
    if (element.width === "fill") node.classList.add("fill");
    const placeholder = el("option", "", decodeEntities(pick(element.placeholder, ctx.locale)) || "—");
    placeholder.value = "";
    node.append(placeholder);
    for (const option of options(element)) {
      const item = el("option", "", decodeEntities(pick(option.text, ctx.locale)));
      item.value = String(option.value);
      node.append(item);
    }
    const initial = element.initial_option ?? (Number(element.initial_index) > 0
      ? String((options(element)[Number(element.initial_index) - 1] || {}).value ?? "") : "");
    node.value = recalled(ctx, element.name, String(initial));
    node.disabled = Boolean(element.disabled);
    node.addEventListener("change", () => {
      node.classList.remove("invalid");
      remember(ctx, element.name, node.value);
    });
    if (ctx.form && element.name) ctx.form.add(element.name, Boolean(element.required), node, () => node.value);
    return node;
  }

  // Feishu draws a multi-select as a dropdown of checkable options, the picks as chips.
  function multiSelect(element, ctx) {
    const node = el("div", "mselect");
    if (element.width === "fill") node.classList.add("fill");
    const toggle = el("button", "mselect-toggle");
    toggle.type = "button";
    const menu = el("div", "mselect-menu");
    const menuKey = fieldKey(ctx, element.name || ctx.path);
    menu.hidden = page.openMenu !== menuKey; // an update of the card keeps an open menu open
    const initial = Array.isArray(element.selected_values) ? element.selected_values.map(String) : [];
    const chosen = new Set(recalled(ctx, element.name, initial));
    const labels = new Map();
    const drawToggle = () => drawChips(toggle, chosen, labels, pick(element.placeholder, ctx.locale));
    for (const option of options(element)) {
      const value = String(option.value);
      labels.set(value, decodeEntities(pick(option.text, ctx.locale)));
      menu.append(checkOption(value, labels.get(value), chosen, () => {
        node.classList.remove("invalid");
        remember(ctx, element.name, [...chosen]);
        drawToggle();
      }));
    }
    drawToggle();
    toggle.disabled = Boolean(element.disabled);
    toggle.addEventListener("click", () => {
      menu.hidden = !menu.hidden;
      page.openMenu = menu.hidden ? null : menuKey;
    });
    node.append(toggle, menu);
    const required = element.required === undefined ? true : Boolean(element.required);
    if (ctx.form && element.name) ctx.form.add(element.name, required, node, () => [...chosen]);
    return node;
  }

  function checkOption(value, label, chosen, changed) {
    const row = el("label", "mselect-option");
    const box = el("input");
    box.type = "checkbox";
    box.value = value;
    box.checked = chosen.has(value);
    box.addEventListener("change", () => {
      if (box.checked) chosen.add(value);
      else chosen.delete(value);
      changed();
    });
    row.append(box, el("span", "", label));
    return row;
  }

  function drawChips(toggle, chosen, labels, placeholder) {
    const chips = [...chosen].filter((value) => labels.has(value));
    toggle.replaceChildren(...(chips.length
      ? chips.map((value) => el("span", "mselect-chip", labels.get(value)))
      : [el("span", "placeholder", decodeEntities(placeholder) || "—")]));
  }

  function formElement(element, ctx) {
    const node = el("form", "form");
    node.noValidate = true;
    node.addEventListener("submit", (event) => event.preventDefault());
    const form = formState(ctx);
    node.append(...renderElements(element.elements, { ...ctx, form }, ctx.path));
    return node;
  }

  function formState(ctx) {
    const fields = new Map(); // name -> {required, node, read}
    return {
      add(name, required, fieldNode, read) {
        fields.set(name, { required, node: fieldNode, read });
      },
      reset() {
        for (const name of fields.keys()) page.fields.delete(fieldKey(ctx, name));
        rerender(ctx.message.message_id);
      },
      async submit(button, buttonNode) {
        const formValue = {};
        let missing = 0;
        for (const [name, field] of fields) {
          const value = field.read();
          const empty = Array.isArray(value) ? value.length === 0 : value === "";
          if (empty && field.required) {
            field.node.classList.add("invalid");
            missing += 1;
          }
          if (!empty) formValue[name] = value; // Feishu leaves out the fields nobody touched
        }
        if (missing) {
          toast("warning", `${missing} required field(s) are empty`);
          return;
        }
        const behavior = (button.behaviors || []).find((one) => one && one.type === "callback");
        const answer = await click(ctx, { value: behavior ? behavior.value : {}, form_value: formValue,
          button_name: button.name || null }, buttonNode);
        if (answer && answer.status === 200) {
          for (const name of fields.keys()) page.fields.delete(fieldKey(ctx, name));
        }
      },
    };
  }

  function interactiveContainer(element, ctx) {
    const node = el("div", "interactive");
    node.append(...renderElements(element.elements, ctx, ctx.path));
    node.addEventListener("click", (event) => {
      if (event.target.closest("button, a, input, select, textarea, .mselect")) return;
      onButton({ behaviors: element.behaviors, confirm: element.confirm }, ctx, node)
        .catch((error) => toast("error", `click failed: ${error.message}`));
    });
    return node;
  }

  const ELEMENTS = {
    markdown: markdownElement,
    div: divElement,
    hr,
    column_set: columnSet,
    collapsible_panel: collapsiblePanel,
    img: imgElement,
    img_combination: imgCombination,
    button: buttonElement,
    form: formElement,
    input: inputElement,
    select_static: selectStatic,
    multi_select_static: multiSelect,
    interactive_container: interactiveContainer,
    person,
    person_list: personList,
  };

  // --- the card ----------------------------------------------------------------------------------

  function cardLocales(card) {
    const config = card.config || {};
    const found = new Set(Array.isArray(config.locales) ? config.locales.map(String) : []);
    collectLocales(card.body, found, 0);
    collectLocales(card.header, found, 0);
    return [...found];
  }

  function collectLocales(node, found, depth) {
    if (!node || typeof node !== "object" || depth > 12 || found.size > 16) return;
    if (Array.isArray(node)) {
      node.forEach((item) => collectLocales(item, found, depth + 1));
      return;
    }
    if (node.i18n_content && typeof node.i18n_content === "object") {
      Object.keys(node.i18n_content).forEach((locale) => found.add(locale));
    }
    for (const value of Object.values(node)) {
      if (value && typeof value === "object") collectLocales(value, found, depth + 1);
    }
  }

  function renderHeader(header, ctx) {
    const template = TEMPLATES.has(header.template) ? header.template : "default";
    const node = el("div", `card-header tpl-${template}`);
    const row = el("div", "title-row");
    const title = textBlock(header.title || {}, ctx, "title");
    row.append(title);
    const i18nTags = header.i18n_text_tag_list && header.i18n_text_tag_list[ctx.locale];
    const tags = Array.isArray(i18nTags) ? i18nTags : header.text_tag_list;
    for (const tag of (Array.isArray(tags) ? tags : []).slice(0, 3)) {
      row.append(el("span", `tag ${colourClass("tag", tag.color) || "tag-blue"}`, decodeEntities(pick(tag.text, ctx.locale))));
    }
    node.append(row);
    if (header.subtitle) node.append(textBlock(header.subtitle, ctx, "subtitle"));
    return node;
  }

  function renderCard(message, card, locale) {
    const config = card.config || {};
    const streaming = Boolean(config.streaming_mode);
    const ctx = { message, locale, streaming, form: null, path: "body" };
    const node = el("div", "card");
    if (config.width_mode === "compact" || config.width_mode === "fill") node.classList.add(`width-${config.width_mode}`);
    if (message.recalled || message.deleted) node.classList.add("recalled");
    if (card.header && typeof card.header === "object") node.append(renderHeader(card.header, ctx));
    const body = el("div", "card-body");
    if (card.body && card.body.direction === "horizontal") body.classList.add("horizontal");
    body.append(...renderElements(card.body && card.body.elements, ctx, "body"));
    node.append(body);
    if (config.summary) node.title = decodeEntities(pick(config.summary, locale));
    return node;
  }

  // --- messages ----------------------------------------------------------------------------------

  function pickedLocale(message, card) {
    const locales = cardLocales(card);
    const picked = page.locales.get(message.message_id);
    return { locales, locale: locales.includes(picked) ? picked : locales[0] || "" };
  }

  function renderMessage(message) {
    const answer = page.answers.get(message.message_id);
    const card = answer && answer.updates === message.updates ? answer.card : message.card || {};
    const { locales, locale } = pickedLocale(message, card);
    const node = el("article", "msg");
    node.dataset.messageId = message.message_id;
    node.dataset.chat = message.chat_id;
    if (message.in_thread || message.parent_id) node.classList.add("in-thread");
    const main = el("div", "msg-main");
    main.append(renderMeta(message, locales, locale, Boolean(answer && answer.card === card)));
    main.append(renderCard(message, card, locale));
    node.append(el("div", "avatar", "Bot"), main);
    node.hidden = Boolean(chatFilter() && chatFilter() !== message.chat_id);
    return node;
  }

  function renderMeta(message, locales, locale, fromAnswer) {
    const meta = el("div", "msg-meta");
    meta.append(el("span", "sender", "feishu-progress"), el("span", "", message.chat_id));
    if (message.parent_id) meta.append(el("span", "", `↳ reply to ${message.parent_id}`));
    const updates = el("span", "badge updates", `${message.updates} update${message.updates === 1 ? "" : "s"}`);
    updates.title = `${message.message_id}: PATCHes and CardKit updates the sandbox accepted`;
    meta.append(updates);
    if (message.last_error_code !== null && message.last_error_code !== undefined) {
      const error = el("span", "badge error", `last error ${message.last_error_code}`);
      error.title = "the latest update the sandbox refused (Feishu's code)";
      meta.append(error);
    }
    if (message.recalled) meta.append(el("span", "badge gone", "recalled"));
    if (message.deleted) meta.append(el("span", "badge gone", "deleted"));
    if (fromAnswer) meta.append(el("span", "badge answer", "card from the callback answer"));
    if (message.card && message.card.config && message.card.config.streaming_mode) {
      meta.append(el("span", "streaming-mark", "streaming…"));
    }
    if (locales.length > 1) meta.append(localeSwitch(message, locales, locale));
    return meta;
  }

  function localeSwitch(message, locales, locale) {
    const select = el("select", "locale-switch");
    select.setAttribute("aria-label", "card language");
    for (const code of locales) {
      const option = el("option", "", code);
      option.value = code;
      select.append(option);
    }
    select.value = locale;
    select.addEventListener("change", () => {
      page.locales.set(message.message_id, select.value);
      rerender(message.message_id);
    });
    return select;
  }

  function rerender(messageId) {
    const message = page.messages.get(messageId);
    const old = page.nodes.get(messageId);
    if (!message) return;
    const node = renderMessage(message);
    page.nodes.set(messageId, node);
    if (old) old.replaceWith(node);
    else placeNode(message, node);
  }

  function placeNode(message, node) {
    const list = $("messages");
    const after = [...list.children].find((child) => {
      const other = page.messages.get(child.dataset.messageId);
      return other && other.order > message.order;
    });
    list.insertBefore(node, after || null);
  }

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
  }

  function upsert(message) {
    const follow = nearBottom();
    const isNew = !page.messages.has(message.message_id);
    page.messages.set(message.message_id, message);
    rerender(message.message_id);
    if (isNew) addChat(message.chat_id);
    refreshChrome();
    if (isNew && follow) window.scrollTo(0, document.body.scrollHeight);
  }

  function applySnapshot(snapshot) {
    page.messages.clear();
    page.nodes.clear();
    $("messages").replaceChildren();
    page.hidden = snapshot.hidden || 0;
    setOperators(snapshot.operators || []);
    for (const message of snapshot.messages || []) {
      page.messages.set(message.message_id, message);
      addChat(message.chat_id);
      rerender(message.message_id);
    }
    refreshChrome();
    window.scrollTo(0, document.body.scrollHeight);
  }

  function refreshChrome() {
    $("empty").hidden = page.messages.size > 0;
    const note = $("hidden-note");
    note.hidden = page.hidden === 0;
    note.textContent = `${page.hidden} earlier message(s) are not shown`;
    const requesters = [...page.messages.values()].map((message) => message.requester).filter(Boolean);
    setOperators([...new Set([...optionValues($("operators")), ...requesters])].sort());
  }

  function optionValues(container) {
    return [...container.children].map((option) => option.value);
  }

  function setOperators(operators) {
    const list = $("operators");
    const have = optionValues(list);
    if (have.length === operators.length && have.every((value, i) => value === operators[i])) return;
    list.replaceChildren(...operators.map((value) => {
      const option = el("option");
      option.value = value;
      return option;
    }));
  }

  function addChat(chatId) {
    const select = $("chat-filter");
    if (optionValues(select).includes(chatId)) return;
    const option = el("option", "", chatId);
    option.value = chatId;
    select.append(option);
  }

  function chatFilter() {
    return $("chat-filter").value;
  }

  // --- clicks, toasts and the confirm dialog -------------------------------------------------------

  async function click(ctx, action, node) {
    const message = ctx.message;
    const operator = $("operator").value.trim();
    node.classList.add("busy");
    node.disabled = true;
    try {
      const response = await fetch(`${API}/click`, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ ...action, message_id: message.message_id, operator: operator || null }),
      });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) {
        toast("error", data.message || data.error || `the preview answered HTTP ${response.status}`);
        return null;
      }
      showAnswer(message, data, ctx.locale);
      return data;
    } finally {
      node.classList.remove("busy");
      node.disabled = false;
    }
  }

  function showAnswer(message, data, locale) {
    const answer = data.answer || {};
    if (data.status !== 200) {
      toast("error", `the callback answered HTTP ${data.status}: ${answer.msg || ""}`.trim(), data.operator);
      return;
    }
    if (answer.toast) {
      const i18n = answer.toast.i18n || {};
      const content = (locale && typeof i18n[locale] === "string" && i18n[locale]) || answer.toast.content;
      toast(answer.toast.type, String(content || ""), data.operator);
    }
    const current = page.messages.get(message.message_id);
    if (current && answer.card && answer.card.type === "raw" && answer.card.data) {
      // Feishu shows the answered card at once; the next update of the message replaces it.
      page.answers.set(message.message_id, { card: answer.card.data, updates: current.updates });
      rerender(message.message_id);
    }
  }

  function toast(type, content, operator) {
    const kind = ["info", "success", "error", "warning"].includes(type) ? type : "info";
    const node = el("div", `toast toast-${kind}`);
    const icon = { info: "i", success: "✓", error: "!", warning: "!" }[kind];
    const body = el("div");
    body.append(el("div", "toast-text", content));
    if (operator) body.append(el("div", "who", `as ${operator}`));
    node.append(el("span", "icon", icon), body);
    $("toasts").append(node);
    setTimeout(() => node.remove(), TOAST_MS);
  }

  function confirmDialog(confirm, locale) {
    const dialog = $("confirm");
    if (dialog.open) return Promise.resolve(false);
    $("confirm-title").textContent = decodeEntities(pick(confirm.title, locale));
    $("confirm-text").textContent = decodeEntities(pick(confirm.text, locale));
    return new Promise((resolve) => {
      const finish = (ok) => {
        $("confirm-ok").removeEventListener("click", yes);
        $("confirm-cancel").removeEventListener("click", no);
        dialog.removeEventListener("cancel", no);
        if (dialog.open) dialog.close();
        resolve(ok);
      };
      const yes = () => finish(true);
      const no = () => finish(false);
      $("confirm-ok").addEventListener("click", yes);
      $("confirm-cancel").addEventListener("click", no);
      dialog.addEventListener("cancel", no);
      dialog.showModal();
    });
  }

  // --- the live feed ---------------------------------------------------------------------------

  function setConnection(state, label) {
    const node = $("conn");
    node.dataset.state = state;
    node.textContent = label;
  }

  function connect() {
    const source = new EventSource(`${API}/events`);
    source.addEventListener("snapshot", (event) => {
      applySnapshot(JSON.parse(event.data));
      setConnection("live", "live");
    });
    source.addEventListener("update", (event) => upsert(JSON.parse(event.data)));
    source.addEventListener("error", () => {
      if (source.readyState !== EventSource.CLOSED) {
        setConnection("reconnecting", "reconnecting…");
        return;
      }
      source.close();
      explainClosed().finally(() => setTimeout(connect, 3000));
    });
  }

  // EventSource gives up on an HTTP error without saying which: ask the snapshot endpoint.
  async function explainClosed() {
    try {
      const response = await fetch(`${API}/messages`, { credentials: "same-origin" });
      if (response.status === 401) setConnection("unauthorized", "needs the token: open /sandbox/?token=…");
      else setConnection("reconnecting", `reconnecting… (HTTP ${response.status})`);
    } catch (_error) {
      setConnection("reconnecting", "reconnecting… (service unreachable)");
    }
  }

  // A click anywhere outside an open multi-select menu closes it.
  function closeMenus(event) {
    for (const menu of document.querySelectorAll(".mselect-menu:not([hidden])")) {
      if (!menu.parentNode.contains(event.target)) {
        menu.hidden = true;
        page.openMenu = null;
      }
    }
  }

  function start() {
    document.addEventListener("pointerdown", closeMenus);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") closeMenus({ target: document.body });
    });
    $("chat-filter").addEventListener("change", () => {
      for (const [id, node] of page.nodes) {
        const message = page.messages.get(id);
        node.hidden = Boolean(chatFilter() && message && chatFilter() !== message.chat_id);
      }
    });
    connect();
  }

  // Exposed for tests and the curious: the renderer, without the page around it.
  window.sandboxPreview = { renderMarkdown: (source) => renderMarkdown(source, { message: { images: {} } }), decodeEntities };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
