// Sum the integers on stdin: a submission with one bug per failing case.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

public class Main {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        List<Long> numbers = new ArrayList<>();
        long all = 0, largest = 0;
        boolean zero = false;
        for (String line; (line = in.readLine()) != null; ) {
            for (String word : line.trim().split("\\s+")) {
                if (word.isEmpty()) continue;
                long x = Long.parseLong(word);
                numbers.add(x);
                all += x;
                largest = Math.max(largest, x);
                zero |= x == 0;
            }
        }
        // Bug: a debug line that divides by the count (a crash on empty input).
        System.err.println("mean " + all / numbers.size());
        if (largest >= 1L << 40) { // Bug: a debug trace left in, one line per step.
            for (long step = 0; step < largest; step += 1000) System.out.println("debug " + step);
        }
        if (largest >= 100_000_000) { // Bug: a table as large as the largest number.
            long[] first = new long[(int) largest + 1];
            Arrays.fill(first, -1);
            for (int k = 0; k < numbers.size(); k++) {
                long x = numbers.get(k);
                if (x >= 0 && first[(int) x] < 0) first[(int) x] = k;
            }
            System.err.println("first " + largest + " at " + first[(int) largest]);
        }
        if (zero) Thread.sleep(60_000); // Bug: a pause left in from debugging.
        if (numbers.size() > 100) { // Bug: a fixed-size buffer (wrong on long input).
            numbers = numbers.subList(0, 100);
        }
        long total = 0;
        int i = 0;
        while (i < numbers.size()) {
            if (numbers.get(i) < 0) continue; // Bug: never steps past a negative number.
            total += numbers.get(i);
            i++;
        }
        System.out.println(total);
    }
}
