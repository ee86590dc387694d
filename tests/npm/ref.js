#!/usr/bin/env node
// Reference token ids from the Hugging Face `tokenizers` library (its Node
// binding), for exl3kit's tokenizer parity tests and benchmark.
//   node ref.js encode TOKENIZER.json FILE [--split lines|whole|blank] [--no-special]
//       one line of ids per document (documents cut like `tokenize --split`;
//       the bytes are decoded as UTF-8 with U+FFFD for invalid sequences)
//   node ref.js decode TOKENIZER.json FILE [--skip-special]
//       FILE holds lines of ids; prints the decoded text of each line
//   node ref.js bench TOKENIZER.json FILE
//       prints "<bytes> <tokens> <seconds>" for encoding FILE line by line
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, 'node_modules', 'tokenizers'));

const [mode, tokPath, file, ...opts] = process.argv.slice(2);
if (!mode || !tokPath || !file) {
  process.stderr.write('usage: ref.js encode|decode|bench TOKENIZER.json FILE [options]\n');
  process.exit(2);
}
const opt = (name) => opts.includes(name);
const split = opts.includes('--split') ? opts[opts.indexOf('--split') + 1] : 'lines';
const tok = Tokenizer.fromFile(tokPath);
const blank = (s) => /^[ \t\r\n\f\v]*$/.test(s);

function documents(text) {
  if (split === 'whole') return blank(text) ? [] : [text];
  const raw = text.split('\n');
  const chomp = (l) => (l.endsWith('\r') ? l.slice(0, -1) : l);
  if (split === 'lines') return raw.map(chomp).filter((l) => !blank(l));
  if (split !== 'blank') throw new Error('bad --split ' + split);
  // paragraphs keep their inner line ends verbatim; the last one's \r goes
  const docs = [];
  let cur = [];
  const flush = () => { if (cur.length) docs.push(chomp(cur.join('\n'))); cur = []; };
  for (const l of raw) { if (blank(l)) flush(); else cur.push(l); }
  flush();
  return docs;
}

(async () => {
  const buf = fs.readFileSync(file);
  const out = [];
  if (mode === 'encode') {
    for (const d of documents(buf.toString('utf8'))) {
      const e = await tok.encode(d, null, { addSpecialTokens: !opt('--no-special') });
      out.push(e.getIds().join(' '));
    }
  } else if (mode === 'decode') {
    const lines = buf.toString('utf8').split('\n');
    if (lines[lines.length - 1] === '') lines.pop();
    for (const l of lines) {
      const ids = l.trim() === '' ? [] : l.trim().split(/\s+/).map(Number);
      out.push(await tok.decode(ids, opt('--skip-special')));
    }
  } else if (mode === 'bench') {
    const docs = documents(buf.toString('utf8'));
    let n = 0;
    const t0 = process.hrtime.bigint();
    for (const d of docs) n += (await tok.encode(d, null, { addSpecialTokens: false })).getIds().length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    out.push(`${buf.length} ${n} ${s}`);
  } else {
    process.stderr.write('ref.js: unknown mode ' + mode + '\n');
    process.exit(2);
  }
  process.stdout.write(out.length ? out.join('\n') + '\n' : '');
})().catch((e) => { process.stderr.write('ref.js: ' + e + '\n'); process.exit(1); });
