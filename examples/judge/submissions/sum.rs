// Sum the integers on stdin: a submission with one bug per failing case.
use std::io::{Read, Write};

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).unwrap();
    let mut numbers: Vec<i64> = input.split_whitespace().map(|w| w.parse().unwrap()).collect();
    let all: i64 = numbers.iter().sum();
    // Bug: a debug line that divides by the count (a crash on empty input).
    eprintln!("mean {}", all / numbers.len() as i64);
    let largest = numbers.iter().copied().max().unwrap_or(0);
    if largest >= 1 << 40 {
        // Bug: a debug trace left in, one line per step.
        let mut out = std::io::stdout().lock();
        for step in (0..largest).step_by(1000) {
            writeln!(out, "debug {step}").unwrap();
        }
    }
    if largest >= 100_000_000 {
        // Bug: a table as large as the largest number.
        let mut first = vec![-1i64; largest as usize + 1];
        for (k, &x) in numbers.iter().enumerate() {
            if x >= 0 && first[x as usize] < 0 {
                first[x as usize] = k as i64;
            }
        }
        eprintln!("first {largest} at {}", first[largest as usize]);
    }
    if numbers.contains(&0) {
        // Bug: a pause left in from debugging.
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
    numbers.truncate(100); // Bug: a fixed-size buffer (wrong on long input).
    let mut total = 0;
    let mut i = 0;
    while i < numbers.len() {
        if numbers[i] < 0 {
            continue; // Bug: never steps past a negative number.
        }
        total += numbers[i];
        i += 1;
    }
    println!("{total}");
}
