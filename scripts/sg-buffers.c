/* O_DIRECT pwrite of 4 GiB in 1 MiB writes to /work/benchdir/sg.dat (edit the path) from one unchanged
 * buffer: 0 posix_memalign, 1 pages faulted in scattered order, 2 a 2 MiB transparent huge page.
 * Build: gcc -O2 -o sg-buffers scripts/sg-buffers.c; run: ./sg-buffers MODE. Cited in BENCHMARKS.md. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <sys/mman.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){int mode=atoi(argv[1]);size_t bs=1<<20;long long total=4LL<<30;
 char*buf;
 if(mode==0){posix_memalign((void**)&buf,4096,bs);memset(buf,1,bs);}
 else if(mode==1){ /* scattered: interleave first touch with another region, reverse order */
   char*a=mmap(0,bs,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
   char*b=mmap(0,bs*8,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
   for(long i=bs/4096-1;i>=0;i--){a[i*4096]=1;for(int k=0;k<3;k++)b[(i*3+k)*4096]=1;}
   buf=a;}
 else { /* THP */
   char*r=mmap(0,4<<20,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
   char*al=(char*)(((unsigned long)r+(2<<20)-1)&~((2UL<<20)-1));
   madvise(al,2<<20,MADV_HUGEPAGE); memset(al,1,2<<20); buf=al;}
 int fd=open("/work/benchdir/sg.dat",O_WRONLY|O_CREAT|O_TRUNC|O_DIRECT,0644);
 double tw=0,t0=now();
 for(long long off=0;off<total;off+=bs){double a=now(); if(pwrite(fd,buf,bs,off)!=(ssize_t)bs){perror("pwrite");return 1;} tw+=now()-a;}
 fdatasync(fd);double dt=now()-t0;
 printf("mode %d (%s): %.0f MB/s, pwrite %.0f us\n",mode,mode==0?"posix_memalign":mode==1?"scattered pages":"huge page",total/dt/1e6,tw/(total/bs)*1e6);
 close(fd);unlink("/work/benchdir/sg.dat");return 0;}
