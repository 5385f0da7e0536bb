// Sum the integers on stdin: a submission with one bug per failing case.
const fs = require("fs");

let numbers = fs.readFileSync(0, "utf8").split(/\s+/).filter((w) => w).map(BigInt);
const all = numbers.reduce((a, b) => a + b, 0n);
// Bug: a debug line that divides by the count (a crash on empty input).
console.error(`mean ${all / BigInt(numbers.length)}`);
const largest = numbers.reduce((a, b) => (b > a ? b : a), 0n);
if (largest >= 2n ** 40n) { // Bug: a debug trace left in, one line per step.
  for (let step = 0n; step < largest; step += 1000n) console.log(`debug ${step}`);
}
if (largest >= 100000000n) { // Bug: a table as large as the largest number.
  const first = new Float64Array(Number(largest) + 1).fill(-1);
  numbers.forEach((x, k) => {
    if (x >= 0n && first[Number(x)] < 0) first[Number(x)] = k;
  });
  console.error(`first ${largest} at ${first[Number(largest)]}`);
}
if (numbers.includes(0n)) { // Bug: a pause left in from debugging.
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 60000);
}
numbers = numbers.slice(0, 100); // Bug: a fixed-size buffer (wrong on long input).
let total = 0n;
let i = 0;
while (i < numbers.length) {
  if (numbers[i] < 0n) continue; // Bug: never steps past a negative number.
  total += numbers[i];
  i++;
}
console.log(String(total));
