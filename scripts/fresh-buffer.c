/* O_DIRECT pwrite of 4 GiB in 1 MiB writes to /work/benchdir/nt.dat (edit the path), from one
 * aligned buffer that is: 0 never changed, 1 refilled by memcpy before each write, 2 refilled by
 * non-temporal stores. Prints MB/s and the mean pwrite time. Build: gcc -O2 -mavx2 -o fresh-buffer
 * scripts/fresh-buffer.c; run: ./fresh-buffer MODE. Cited in BENCHMARKS.md ("Runtime"). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void nt_copy(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m256i a=_mm256_loadu_si256((const __m256i*)(s+i));__m256i b=_mm256_loadu_si256((const __m256i*)(s+i+32));_mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);}_mm_sfence();}
int main(int argc,char**argv){int mode=atoi(argv[1]);size_t bs=1<<20;long long total=4LL<<30;
 int fd=open("/work/benchdir/nt.dat",O_WRONLY|O_CREAT|O_TRUNC|O_DIRECT,0644);
 char*src=malloc(bs);for(size_t i=0;i<bs;i++)src[i]=i;
 char*buf;posix_memalign((void**)&buf,4096,bs);memset(buf,1,bs);
 double tw=0,t0=now();
 for(long long off=0;off<total;off+=bs){
   if(mode==1)memcpy(buf,src,bs); else if(mode==2)nt_copy(buf,src,bs);
   double a=now(); if(pwrite(fd,buf,bs,off)!=(ssize_t)bs){perror("pwrite");return 1;} tw+=now()-a;}
 fdatasync(fd);double dt=now()-t0;
 printf("mode %d (%s): %.0f MB/s, pwrite %.0f us\n",mode,mode==0?"unchanged":mode==1?"memcpy":"non-temporal",total/dt/1e6,tw/(total/bs)*1e6);
 close(fd);unlink("/work/benchdir/nt.dat");return 0;}
