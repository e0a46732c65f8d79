// The strict JSON dialect of SPEC 3.2-3.4 (RFC 8259 + I-JSON as pinned down there), also used
// for safetensors headers (SPEC 6.3 rule 2). JSON.parse is not enough: it accepts duplicate
// names, rounds integers through binary64 and recurses. This parser is iterative (bounded
// depth, SPEC 3.4 rule 2), keeps integer tokens exact as bigint (SPEC 3.3 rule 3) and keeps
// objects as Maps (no prototype keys). No Node APIs.

/** A parsed value: integer tokens are bigint, other number tokens are number. */
export type JValue = null | boolean | string | number | bigint | JValue[] | JObject;
export type JObject = Map<string, JValue>;

/** Kinds of JSON problem; callers map them to codes (json-* for manifests, st-* for headers). */
export type JsonProblem = "encoding" | "syntax" | "duplicate" | "nonfinite" | "depth";

export class JsonError extends Error {
  constructor(
    readonly problem: JsonProblem,
    message: string,
  ) {
    super(message);
    this.name = "JsonError";
  }
}

export function isObject(v: JValue | undefined): v is JObject {
  return v instanceof Map;
}

export function isArray(v: JValue | undefined): v is JValue[] {
  return Array.isArray(v);
}

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Decode UTF-8 strictly (SPEC 3.2 rule 1): a BOM or an invalid sequence is an encoding problem. */
export function decodeUtf8(bytes: Uint8Array, allowBom = false): string {
  if (!allowBom && bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) {
    throw new JsonError("encoding", "starts with a UTF-8 byte order mark");
  }
  try {
    return decoder.decode(bytes);
  } catch {
    throw new JsonError("encoding", "is not valid UTF-8");
  }
}

export interface ParseOptions {
  maxDepth: number;
  /** "json": RFC 8259 whitespace may follow the value; "spaces": only U+0020 (SPEC 6.3 rule 2). */
  trailing: "json" | "spaces";
}

type Frame =
  | { kind: "array"; value: JValue[] }
  | { kind: "object"; value: JObject; key: string };

const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;

/**
 * Parse one JSON text. Syntax and depth problems are thrown at once; the I-JSON problems
 * (duplicate names, NaN/Infinity, numbers beyond binary64, escaped lone surrogates) are
 * remembered and thrown after the whole text proved syntactically valid, so that a text that
 * is not JSON at all is reported as a syntax problem.
 */
export function parseJson(text: string, options: ParseOptions): JValue {
  let i = 0;
  const n = text.length;
  let deferred: JsonError | null = null;
  const defer = (problem: JsonProblem, message: string): void => {
    if (deferred === null) deferred = new JsonError(problem, message);
  };
  const syntax = (what: string): never => {
    throw new JsonError("syntax", `${what} at character ${i}`);
  };
  const skipWs = (): void => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else break;
    }
  };

  const parseString = (): string => {
    // text[i] is '"'
    i++;
    let out = "";
    let start = i;
    for (;;) {
      if (i >= n) syntax("unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 0x20) syntax("unescaped control character in string");
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += text.slice(start, i);
      i++;
      const e = text[i];
      i++;
      switch (e) {
        case '"': out += '"'; break;
        case "\\": out += "\\"; break;
        case "/": out += "/"; break;
        case "b": out += "\b"; break;
        case "f": out += "\f"; break;
        case "n": out += "\n"; break;
        case "r": out += "\r"; break;
        case "t": out += "\t"; break;
        case "u": {
          const u = readHex4();
          if (u >= 0xd800 && u <= 0xdbff) {
            if (text[i] === "\\" && text[i + 1] === "u") {
              i += 2;
              const v = readHex4();
              if (v >= 0xdc00 && v <= 0xdfff) {
                out += String.fromCharCode(u, v);
              } else {
                defer("encoding", "string contains an escaped lone surrogate");
                out += String.fromCharCode(u, v);
              }
            } else {
              defer("encoding", "string contains an escaped lone surrogate");
              out += String.fromCharCode(u);
            }
          } else if (u >= 0xdc00 && u <= 0xdfff) {
            defer("encoding", "string contains an escaped lone surrogate");
            out += String.fromCharCode(u);
          } else {
            out += String.fromCharCode(u);
          }
          break;
        }
        default:
          i--;
          syntax("invalid escape");
      }
      start = i;
    }
  };

  const readHex4 = (): number => {
    const h = text.slice(i, i + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) syntax("invalid \\u escape");
    i += 4;
    return parseInt(h, 16);
  };

  const parseNumber = (): number | bigint => {
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m === null) return syntax("invalid number");
    const token = m[0];
    i += token.length;
    if (m[1] === undefined && m[2] === undefined) {
      const v = BigInt(token);
      // SPEC 3.3 rule 2: a number too large for binary64, integer tokens included.
      if (token.length > 300 && !Number.isFinite(Number(v))) {
        defer("nonfinite", `number ${token.slice(0, 20)}... is too large for binary64`);
      }
      return v;
    }
    const f = Number(token);
    if (!Number.isFinite(f)) defer("nonfinite", `number ${token} is too large for binary64`);
    return f;
  };

  /** A scalar value at text[i], or null when a container starts there. */
  const stack: Frame[] = [];
  let result: JValue = null;
  let haveValue = false;

  const push = (frame: Frame): void => {
    // SPEC 3.4 rule 2: the top-level container has depth 1.
    if (stack.length + 1 > options.maxDepth) {
      throw new JsonError("depth", `nesting deeper than ${options.maxDepth}`);
    }
    stack.push(frame);
  };

  const readKey = (): string => {
    skipWs();
    if (text[i] !== '"') syntax("expected a member name");
    const key = parseString();
    skipWs();
    if (text[i] !== ":") syntax("expected ':'");
    i++;
    return key;
  };

  // Each turn reads a value (scalar or container start), then closes what it completes.
  outer: for (;;) {
    skipWs();
    if (i >= n) syntax("unexpected end of text");
    const c = text[i];
    let value: JValue;
    if (c === "{") {
      i++;
      skipWs();
      if (text[i] === "}") {
        i++;
        if (stack.length + 1 > options.maxDepth) throw new JsonError("depth", `nesting deeper than ${options.maxDepth}`);
        value = new Map();
      } else {
        push({ kind: "object", value: new Map(), key: readKey() });
        continue;
      }
    } else if (c === "[") {
      i++;
      skipWs();
      if (text[i] === "]") {
        i++;
        if (stack.length + 1 > options.maxDepth) throw new JsonError("depth", `nesting deeper than ${options.maxDepth}`);
        value = [];
      } else {
        push({ kind: "array", value: [] });
        continue;
      }
    } else if (c === '"') {
      value = parseString();
    } else if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) {
      if (text.startsWith("-Infinity", i)) {
        defer("nonfinite", "-Infinity is not JSON");
        i += 9;
        value = -Infinity;
      } else {
        value = parseNumber();
      }
    } else if (text.startsWith("true", i)) {
      i += 4;
      value = true;
    } else if (text.startsWith("false", i)) {
      i += 5;
      value = false;
    } else if (text.startsWith("null", i)) {
      i += 4;
      value = null;
    } else if (text.startsWith("NaN", i)) {
      // SPEC 3.3 rule 2: tokens some parsers accept.
      defer("nonfinite", "NaN is not JSON");
      i += 3;
      value = NaN;
    } else if (text.startsWith("Infinity", i)) {
      defer("nonfinite", "Infinity is not JSON");
      i += 8;
      value = Infinity;
    } else {
      return syntax("unexpected character");
    }

    // Attach the value to its container; close containers that end here.
    for (;;) {
      const top = stack[stack.length - 1];
      if (top === undefined) {
        result = value;
        haveValue = true;
        break outer;
      }
      if (top.kind === "array") {
        top.value.push(value);
        skipWs();
        const d = text[i];
        if (d === ",") {
          i++;
          continue outer;
        }
        if (d !== "]") syntax("expected ',' or ']'");
        i++;
      } else {
        // SPEC 3.3 rule 1: names compared after unescaping.
        if (top.value.has(top.key)) defer("duplicate", `duplicate name ${JSON.stringify(top.key)}`);
        top.value.set(top.key, value);
        skipWs();
        const d = text[i];
        if (d === ",") {
          i++;
          top.key = readKey();
          continue outer;
        }
        if (d !== "}") syntax("expected ',' or '}'");
        i++;
      }
      stack.pop();
      value = top.value;
    }
  }

  if (!haveValue) syntax("no value");
  if (options.trailing === "json") {
    skipWs();
  } else {
    while (i < n && text.charCodeAt(i) === 0x20) i++;
  }
  if (i < n) syntax("data after the JSON value");
  if (deferred !== null) throw deferred;
  return result;
}
