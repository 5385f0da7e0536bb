// Sum the integers on stdin: a submission with one bug per failing case.
#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

int main() {
    std::vector<long long> numbers;
    long long x, all = 0, largest = 0;
    bool zero = false;
    while (std::cin >> x) {
        numbers.push_back(x);
        all += x;
        largest = std::max(largest, x);
        zero = zero || x == 0;
    }
    // Bug: a debug line that divides by the count (a crash on empty input).
    std::cerr << "mean " << all / static_cast<long long>(numbers.size()) << "\n";
    if (largest >= 1LL << 40)  // Bug: a debug trace left in, one line per step.
        for (long long step = 0; step < largest; step += 1000)
            std::cout << "debug " << step << "\n";
    if (largest >= 100000000) {  // Bug: a table as large as the largest number.
        std::vector<long long> first(largest + 1, -1);
        for (size_t k = 0; k < numbers.size(); k++)
            if (numbers[k] >= 0 && first[numbers[k]] < 0)
                first[numbers[k]] = static_cast<long long>(k);
        std::cerr << "first " << largest << " at " << first[largest] << "\n";
    }
    if (zero)  // Bug: a pause left in from debugging.
        std::this_thread::sleep_for(std::chrono::seconds(60));
    if (numbers.size() > 100)
        numbers.resize(100);  // Bug: a fixed-size buffer (wrong on long input).
    long long total = 0;
    volatile size_t i = 0;  // volatile: the loop below need not end
    while (i < numbers.size()) {
        if (numbers[i] < 0)
            continue;  // Bug: never steps past a negative number.
        total += numbers[i];
        i++;
    }
    std::cout << total << "\n";
}
