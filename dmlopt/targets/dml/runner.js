// dmlopt's runner for the real DirectML EP: one job, one model, one process (Windows node.exe under Wine).
//
//   node.exe runner.js JOB.json
//
// dmlopt (dmlopt/targets/dml/host.py) writes JOB.json and reads RESULT.json; tensors travel as .npy files.
// Why files: Windows node.exe under Wine cannot write to a pipe (EBADF), so its stdout/stderr go to a file,
// which is also where ONNX Runtime's verbose log (placements, Memcpy nodes) lands; host.py parses it.
// JOB: {ort: dir of onnxruntime-node, model, inputs: [[name, file.npy]], strings: [[name, [dims]]],
//       outputs_dir, result, session: {optLevel, disableFusion, verbose, profile: file prefix}, warmup, runs}
// Names travel as arrays of pairs, never as object keys ('__proto__' is not a key in JavaScript);
// host.py renames every value and node of the model to safe names for the run anyway (host_names.py).
// RESULT: {ok, ort_version, session_ms, warmup_ms: [], run_ms: [], outputs: [{name, file, dtype, shape}],
//          error}
'use strict';
const fs = require('fs');
const path = require('path');

const DTYPES = {  // npy descr <-> ORT tensor type and typed array
  '<f4': ['float32', Float32Array], '<f8': ['float64', Float64Array], '<f2': ['float16', Uint16Array],
  '<i8': ['int64', BigInt64Array], '<i4': ['int32', Int32Array], '<i2': ['int16', Int16Array],
  '|i1': ['int8', Int8Array], '|u1': ['uint8', Uint8Array], '<u2': ['uint16', Uint16Array],
  '<u4': ['uint32', Uint32Array], '<u8': ['uint64', BigUint64Array], '|b1': ['bool', Uint8Array],
};
const DESCR = {};
for (const [d, [t]] of Object.entries(DTYPES)) if (!(t in DESCR)) DESCR[t] = d;

function npyLoad(ort, file) {
  const b = fs.readFileSync(file);
  if (b.length < 10 || b.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(file + ' is not a .npy file');
  const major = b[6];
  const headerLen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = b.toString('latin1', start, start + headerLen);
  const descr = (header.match(/'descr':\s*'([^']*)'/) || [])[1];
  const shapeText = (header.match(/'shape':\s*\(([^)]*)\)/) || [])[1];
  if (!descr || shapeText === undefined || /'fortran_order':\s*True/.test(header)) {
    throw new Error(file + ': unsupported .npy header ' + header.trim());
  }
  if (!DTYPES[descr]) throw new Error(file + ': dtype ' + descr + ' is not supported');
  const [type, Typed] = DTYPES[descr];
  const dims = shapeText.split(',').map(s => s.trim()).filter(s => s.length).map(Number);
  const body = b.subarray(start + headerLen);
  const aligned = new ArrayBuffer(body.length);  // typed arrays need an aligned, owned buffer
  new Uint8Array(aligned).set(body);
  return new ort.Tensor(type, new Typed(aligned), dims);
}

function npySave(file, tensor) {
  const descr = DESCR[tensor.type];
  if (!descr) throw new Error('output type ' + tensor.type + ' cannot be written as .npy');
  const dims = tensor.dims.map(Number);
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  const total = 10 + header.length + 1;
  header += ' '.repeat((64 - (total % 64)) % 64) + '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const data = tensor.data;
  const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'), bytes]));
}

function sessionOptions(s) {
  // Only keys with values: the native binding under Wine page-faults on a key whose value is undefined.
  const so = {
    executionProviders: [{ name: 'dml' }],
    graphOptimizationLevel: s.optLevel || 'all',
    logSeverityLevel: s.verbose === false ? 3 : 0,
    logVerbosityLevel: 0,
  };
  if (s.disableFusion) so.extra = { ep: { dml: { disable_graph_fusion: '1' } } };
  if (s.profile) { so.enableProfiling = true; so.profileFilePrefix = s.profile; }
  return so;
}

async function main() {
  const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const result = { ok: false, ort_version: null, session_ms: null, warmup_ms: [], run_ms: [], outputs: [] };
  const finish = () => fs.writeFileSync(job.result, JSON.stringify(result));
  try {
    const ort = require(job.ort);
    result.ort_version = JSON.parse(fs.readFileSync(path.join(job.ort, 'package.json'), 'utf8')).version;
    if (job.session.verbose !== false) ort.env.logLevel = 'verbose';
    const feeds = {};
    for (const [name, file] of job.inputs || []) feeds[name] = npyLoad(ort, file);
    for (const [name, dims] of job.strings || []) {
      const n = dims.reduce((a, b) => a * b, 1);
      feeds[name] = new ort.Tensor('string', new Array(n).fill('dmlopt'), dims);
    }
    const t0 = process.hrtime.bigint();
    const session = await ort.InferenceSession.create(job.model, sessionOptions(job.session));
    result.session_ms = Number(process.hrtime.bigint() - t0) / 1e6;
    console.log('DMLOPT session created');
    let out = null;
    for (let i = 0; i < (job.warmup || 0) + Math.max(1, job.runs || 1); i++) {
      const t = process.hrtime.bigint();
      out = await session.run(feeds);
      const ms = Number(process.hrtime.bigint() - t) / 1e6;
      (i < (job.warmup || 0) ? result.warmup_ms : result.run_ms).push(ms);
    }
    let k = 0;
    for (const name of session.outputNames) {
      if (!Object.prototype.hasOwnProperty.call(out, name)) throw new Error('ORT returned no output ' + JSON.stringify(name));
      const tensor = out[name];
      if (tensor.type === 'string') continue;
      const file = `out${k++}.npy`;
      npySave(path.join(job.outputs_dir, file), tensor);
      result.outputs.push({ name, file, dtype: tensor.type, shape: tensor.dims.map(Number) });
    }
    if (job.session.profile && session.endProfiling) session.endProfiling();  // ORT 1.24+ writes the file
    if (session.release) await session.release();
    result.ok = true;
  } catch (e) {
    result.error = String((e && e.message) || e).split('\n')[0].slice(0, 500);
    console.log('DMLOPT FAILED ' + ((e && e.stack) || e));
  }
  finish();
  console.log('DMLOPT done');
}

main().then(() => process.exit(0), () => process.exit(1));
