// CK(call): exit with the CUDA error's name and the line, for the standalone nvcc benchmarks in bench/.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                  \
      printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)
